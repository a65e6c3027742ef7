#!/usr/bin/env bash
# `make wheel-test`: installs dist/'s wheel (make wheel) into a fresh virtual environment with
# no network (pip --no-index; --system-site-packages only lends numpy-like packages, cpcache
# needs none), then runs the Python example from a temporary directory on 2 ranks under the
# cpcache binary the wheel installed; the wheel's library and binary load nothing beyond glibc,
# libstdc++ and libgcc_s from the system. Run from the repository root.
set -euo pipefail
root=$PWD
PYTHON=${PYTHON:-python3}
version=$(cat VERSION)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "wheel-test: $*" >&2; exit 1; }

wheel=$(ls dist/cpcache-"$version"-py3-none-*.whl)
"$PYTHON" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$wheel" ||
  fail "pip install --no-index $wheel failed"
cd "$tmp"
cp "$root/python/examples/hicache_controller.py" .
unset CPCACHE_LIBRARY CPCACHE_BIN PYTHONPATH
export PATH="$tmp/venv/bin:/usr/bin:/bin"
[ "$(command -v cpcache)" = "$tmp/venv/bin/cpcache" ] || fail "the wheel put no cpcache on the venv's PATH"
got=$(python -c 'import cpcache, importlib.metadata as m; print(cpcache.__file__, cpcache.library()._name, cpcache.version(), m.version("cpcache"))')
site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
want="$site/cpcache/__init__.py $site/cpcache/libcpcache.so $version $version"
[ "$got" = "$want" ] || fail "the installed package says \"$got\", want \"$want\""
# Everything beyond glibc, libstdc++ and libgcc_s comes from the wheel (cpcache/.libs).
for f in "$site/cpcache/libcpcache.so" "$site/cpcache/bin/cpcache"; do
  [ -f "$f" ] || fail "the wheel installed no $f"
  outside=$(ldd "$f" | awk '$2 == "=>" { print $1, ($3 == "not" ? "(not found)" : $3) }' |
    while read -r name path; do
      [[ $path == /* ]] && path=$(realpath "$path")
      [[ $path == "$site/cpcache/.libs/"* ]] || echo "$name $path"
    done | grep -vE '^(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[-.a-z0-9_]*)\.so' || true)
  [ -z "$outside" ] || fail "$f loads from outside the wheel: $(tr '\n' ' ' <<<"$outside")"
done
timeout 300 cpcache launch -n 2 -- python hicache_controller.py --attn-cp 2 >"$tmp/py.log" 2>&1 ||
  { cat "$tmp/py.log"; fail "the Python example failed"; }
echo "wheel-test: $(basename "$wheel") installed offline into a venv; the example ran on 2 ranks:"
tail -n 2 "$tmp/py.log"
