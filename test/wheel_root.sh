#!/usr/bin/env bash
# `make wheel-root-test`: the wheel on a stock machine. A minimal Debian bookworm root
# (debootstrap --variant=minbase with python3, python3-numpy and python3-pip: no Gloo, hiredis,
# libibverbs or libnl, no Go, no compiler) gets dist/'s wheel with pip offline (--no-index), then
# under chroot imports cpcache and runs the Python example on 2 ranks under the wheel's
# `cpcache launch`, with the shared-memory consensus and with Gloo's. Run from the repository
# root, as root (debootstrap, chroot, mount).
#
# The root is built once and cached in $CPCACHE_DEBROOT (build/_debroot/bookworm-minbase: a
# directory whose name starts with _, which Go's ./... patterns skip, so that vet, staticcheck
# and go test, running while make test builds it, do not walk the root, nor its /proc while
# debootstrap has it mounted; a root of your own must be outside them too); each
# run works on an overlay of it (a copy where overlayfs is missing), so the cache stays clean.
# debootstrap (8 minutes on a loaded 2-core machine) is bounded by $DEBOOTSTRAP_TIMEOUT seconds
# (900): a mirror that does not answer
# is a failure naming it, not a hang. The mirror is $DEBIAN_MIRROR, else the one apt uses here
# for bookworm, else deb.debian.org.
#
# `make test` builds that root early, in the background, while the Go tests run (--root-only,
# started by the Makefile's debroot-start): the build holds a lock ($cache.lock), so this
# script, run later, waits for it and then finds the cache; a background build that failed
# left nothing, and the build here runs again and reports.
#
# Usage: test/wheel_root.sh [WHEEL]   (default: dist/cpcache-$VERSION-*.whl)
#        test/wheel_root.sh --root-only   (build the cached root, if missing, and stop)
set -euo pipefail
root=$PWD
version=$(cat VERSION)
fail() { echo "wheel-root-test: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then exec sudo -n --preserve-env=DEBIAN_MIRROR,DEBOOTSTRAP_TIMEOUT,CPCACHE_DEBROOT "$0" "$@"; fi
  fail "needs root (debootstrap, chroot and mount): run it as root, or with passwordless sudo"
fi
for t in debootstrap chroot mount umount findmnt flock; do
  command -v $t >/dev/null || fail "$t not found (Debian: apt-get install debootstrap util-linux mount)"
done

root_only=false
if [ "${1:-}" = --root-only ]; then root_only=true
elif [ $# -ge 1 ]; then wheel=$1; else
  wheel=$(ls dist/cpcache-"$version"-*.whl 2>/dev/null) || fail "no dist/cpcache-$version-*.whl: run make wheel"
  [ "$(wc -l <<<"$wheel")" = 1 ] || fail "more than one wheel in dist/: $wheel"
fi
if ! $root_only; then
  [ -f "$wheel" ] || fail "$wheel: no such wheel"
  wheel=$(realpath "$wheel")
fi

suite=bookworm
include=python3,python3-numpy,python3-pip
# The mirror this machine's apt uses for bookworm, else deb.debian.org.
apt_mirror=$(apt-cache policy 2>/dev/null | awk -v s="$suite/main" '$3 == s && $2 ~ /^https?:\/\// {print $2; exit}' || true)
mirror=${DEBIAN_MIRROR:-${apt_mirror:-http://deb.debian.org/debian}}
cache=$(realpath -m "${CPCACHE_DEBROOT:-build/_debroot/$suite-minbase}")
want="$suite minbase $include"

# unmount_under DIR: every mount at or below DIR, deepest first (lazily if busy).
unmount_under() {
  local d
  findmnt -rn -o TARGET | awk -v p="$1" '$0 == p || index($0, p "/") == 1' | sort -r | while read -r d; do
    umount "$d" 2>/dev/null || umount -l "$d" || echo "wheel-root-test: could not unmount $d" >&2
  done
}

# One build at a time: a build running (make test's, in the background) is waited for.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
if ! flock -n 9; then
  echo "wheel-root-test: waiting for the $suite root being built (log: $cache.log)"
  flock 9
fi
if [ ! -f "$cache/.cpcache-root" ] || [ "$(cat "$cache/.cpcache-root")" != "$want" ]; then
  part=$cache.part
  unmount_under "$part"
  rm -rf --one-file-system "$part" "$cache"
  mkdir -p "$(dirname "$cache")"
  echo "wheel-root-test: debootstrap --variant=minbase --include=$include $suite from $mirror (once; cached in $cache)"
  start=$(date +%s)
  rc=0
  timeout --kill-after=10 "${DEBOOTSTRAP_TIMEOUT:-900}" \
    debootstrap --variant=minbase --include="$include" "$suite" "$part" "$mirror" >"$cache.log" 2>&1 || rc=$?
  took=$(($(date +%s) - start))
  if [ $rc != 0 ]; then
    unmount_under "$part"
    tail -n 15 "$cache.log" >&2
    [ -f "$part/debootstrap/debootstrap.log" ] && tail -n 15 "$part/debootstrap/debootstrap.log" >&2
    rm -rf --one-file-system "$part"
    if [ $rc = 124 ] || [ $rc = 137 ]; then
      fail "debootstrap of $suite from $mirror did not finish within ${DEBOOTSTRAP_TIMEOUT:-900} s (killed; log: $cache.log)"
    fi
    fail "debootstrap of $suite from $mirror failed (exit $rc after $took s; log: $cache.log)"
  fi
  echo "$want" >"$part/.cpcache-root"
  mv "$part" "$cache"
  echo "wheel-root-test: debootstrap took $took s ($(du -sh "$cache" | cut -f1))"
fi
exec 9>&-
$root_only && exit 0

tmp=$(mktemp -d /tmp/cpcache-wheel-root.XXXXXX)
cleanup() {
  unmount_under "$tmp"
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
chr=$tmp/root
mkdir -p "$tmp/upper" "$tmp/work" "$chr"
if ! mount -t overlay overlay -o "lowerdir=$cache,upperdir=$tmp/upper,workdir=$tmp/work" "$chr" 2>/dev/null; then
  echo "wheel-root-test: no overlayfs here: copying the root"
  cp -a "$cache/." "$chr/"
fi
mount -t proc proc "$chr/proc"
mkdir -p "$chr/dev/shm"
# A shm of its own: the ranks' shm consensus and slabs, apart from the host's /dev/shm.
mount -t tmpfs -o mode=1777,size=1g tmpfs "$chr/dev/shm"

# in_root CMD...: runs a shell command in the root as a fresh login would, bounded.
in_root() {
  timeout --kill-after=10 300 chroot "$chr" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 /bin/sh -c "$1"
}

# The root is what the test claims: none of the libraries libcpcache links on the build machine.
libs=$(in_root 'ldconfig -p') || fail "ldconfig -p failed in the $suite root"
have=$(grep -oE 'lib(gloo|hiredis|ibverbs|nl-3|nl-route-3)\.so[.0-9]*' <<<"$libs" | sort -u | tr '\n' ' ' || true)
[ -z "$have" ] || fail "the root is not stock: it has $have"

name=$(basename "$wheel")
cp "$wheel" "$chr/tmp/$name"
cp "$root/python/examples/hicache_controller.py" "$chr/tmp/"
# PEP 668: Debian's python3 installs into /usr/local only when told to.
in_root "python3 -m pip install -q --no-index --no-deps --disable-pip-version-check --break-system-packages /tmp/$name" \
  >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install --no-index $name failed in the $suite root"; }
got=$(in_root 'cd /tmp && python3 -c "import cpcache; print(cpcache.version())"' 2>&1) ||
  fail "import cpcache in the $suite root failed: $got"
[ "$got" = "$version" ] || fail "cpcache.version() in the $suite root says \"$got\", want $version"
missing=$(in_root 'cd / && for f in $(python3 -c "import cpcache, os; d = os.path.dirname(cpcache.__file__); print(d + \"/libcpcache.so\", d + \"/bin/cpcache\")"); do ldd $f; done' | grep 'not found' || true)
[ -z "$missing" ] || fail "in the $suite root the wheel's binaries miss: $missing"
in_root 'cd /tmp && cpcache --version' >"$tmp/version.log" 2>&1 || { cat "$tmp/version.log"; fail "cpcache --version failed in the $suite root"; }
in_root 'cd /tmp && cpcache launch -n 2 -- python3 hicache_controller.py --attn-cp 2' >"$tmp/py.log" 2>&1 ||
  { cat "$tmp/py.log"; fail "the Python example on 2 ranks under the wheel's cpcache launch failed in the $suite root"; }
[ "$(grep -c 'bad_pages=0' "$tmp/py.log")" = 2 ] || { cat "$tmp/py.log"; fail "want a report with bad_pages=0 from both ranks"; }
# Again over the bundled Gloo (TCP between the ranks) instead of the shared-memory consensus.
in_root 'cd /tmp && CPCACHE_CONSENSUS_BACKEND=gloo cpcache launch -n 2 -- python3 hicache_controller.py --attn-cp 2' >"$tmp/gloo.log" 2>&1 ||
  { cat "$tmp/gloo.log"; fail "the Python example on 2 ranks over Gloo failed in the $suite root"; }
[ "$(grep -c 'bad_pages=0' "$tmp/gloo.log")" = 2 ] || { cat "$tmp/gloo.log"; fail "over Gloo: want a report with bad_pages=0 from both ranks"; }
echo "wheel-root-test: $name installed offline into a minimal $suite root (no Gloo, hiredis, libibverbs, libnl); $(cat "$tmp/version.log"); the example ran on 2 ranks (shared-memory consensus, then Gloo):"
tail -n 2 "$tmp/py.log"
