#!/usr/bin/env bash
# `make install-test`: installs cpcache into a temporary DESTDIR (PREFIX=/usr/local) and uses
# it from another directory as a user would: the binary's version, the C example built with
# pkg-config and with find_package(cpcache), the Python example, each run on 2 ranks under the
# installed `cpcache launch`; then `make install PREFIX=$HOME/.local` with HOME a temporary
# home, after which that home's python3 imports cpcache from its user site with no PYTHONPATH.
# Run from the repository root.
set -euo pipefail
root=$PWD
PYTHON=${PYTHON:-python3}
version=$(cat VERSION)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install-test: $*" >&2; exit 1; }
# For the install into a temporary home below: this PATH, and Go's caches under the real HOME.
build_path=$PATH
gocache=$(go env GOCACHE) gopath=$(go env GOPATH) gomodcache=$(go env GOMODCACHE)

make -s install DESTDIR="$tmp/stage" PREFIX=/usr/local >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install failed"; }
p=$tmp/stage/usr/local
for f in bin/cpcache include/cpcache.h lib/libcpcache.so lib/libcpcache.a lib/pkgconfig/cpcache.pc \
  lib/cmake/cpcache/cpcacheConfig.cmake; do
  [ -e "$p/$f" ] || fail "make install left no $f (under $p: $(cd "$p" && find . -type f | sort | tr '\n' ' '))"
done
[ "$(ls "$p/include")" = cpcache.h ] || fail "include/ holds $(ls "$p/include"), want cpcache.h alone"
pydir=$(dirname "$(find "$p/lib" -path '*-packages/cpcache/__init__.py')")
[ -n "$pydir" ] && [ -e "$pydir/libcpcache.so" ] || fail "no Python package with libcpcache.so beside it under $p/lib"

work=$tmp/work
mkdir "$work" && cd "$work"
export PATH="$p/bin:/usr/bin:/bin"
got=$(cpcache --version)
[[ $got == "cpcache $version ("* ]] || fail "cpcache --version printed \"$got\", want cpcache $version"
echo "install-test: $got from $p/bin"

cp "$root/examples/c/engine.c" .
# The .pc names the final prefix; --define-prefix finds the staged one from the file's place.
flags=$(PKG_CONFIG_PATH=$p/lib/pkgconfig pkg-config --define-prefix --cflags --libs cpcache)
cc -O2 engine.c $flags -ldl -o engine
mkdir elsewhere && cd elsewhere
timeout 300 cpcache launch -n 2 -- ../engine --attn-cp 2 >"$tmp/engine.log" 2>&1 || { cat "$tmp/engine.log"; fail "the pkg-config engine failed"; }
grep -q "requests=" "$tmp/engine.log" || { cat "$tmp/engine.log"; fail "the pkg-config engine printed no report"; }
echo "install-test: engine.c built with pkg-config ($flags) ran on 2 ranks"
cd "$work"

mkdir consumer && cp "$root/examples/c/CMakeLists.txt" "$root/examples/c/engine.c" consumer/
cmake -S consumer -B consumer/build -DCMAKE_PREFIX_PATH="$p" >/dev/null
cmake --build consumer/build >/dev/null
timeout 300 cpcache launch -n 2 -- consumer/build/cpcache_engine --attn-cp 2 >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "the find_package engine failed"; }
echo "install-test: engine.c built with find_package(cpcache) ran on 2 ranks"

cp "$root/python/examples/hicache_controller.py" .
PYTHONPATH=$pydir/.. timeout 300 cpcache launch -n 2 -- "$PYTHON" hicache_controller.py --attn-cp 2 >"$tmp/py.log" 2>&1 || { cat "$tmp/py.log"; fail "the Python example failed"; }
got=$(PYTHONPATH=$pydir/.. "$PYTHON" -c 'import cpcache; print(cpcache.__file__, cpcache.version())')
[[ $got == "$pydir/__init__.py $version" ]] || fail "python imports cpcache as \"$got\", want $pydir/__init__.py $version"
echo "install-test: the Python example ran on 2 ranks with the installed package ($got)"

# A user without root: make install PREFIX=$HOME/.local puts the package in that user's site
# (`python3 -m site --user-site`), which the interpreter searches with no PYTHONPATH. Go keeps
# this machine's caches (they live under the real HOME).
cd "$root"
export PATH=$build_path GOCACHE=$gocache GOPATH=$gopath GOMODCACHE=$gomodcache
home=$tmp/home
mkdir -p "$home"
unset PYTHONPATH PYTHONUSERBASE
usersite=$(HOME=$home "$PYTHON" -m site --user-site)
[[ $usersite == "$home/.local/"* ]] || fail "$PYTHON's user site with HOME=$home is $usersite, not under $home/.local"
HOME=$home make -s install PREFIX="$home/.local" PYTHON="$PYTHON" >"$tmp/user.log" 2>&1 ||
  { cat "$tmp/user.log"; fail "make install PREFIX=$home/.local failed"; }
cd "$work"
got=$(HOME=$home "$PYTHON" -c 'import cpcache; print(cpcache.__file__, cpcache.version())' 2>&1) ||
  fail "make install PREFIX=\$HOME/.local put the package in $(cd "$home/.local" && find . -name __init__.py -path '*cpcache*'), not in the user site $usersite: python3 says: $(tail -n 1 <<<"$got")"
[ "$got" = "$usersite/cpcache/__init__.py $version" ] || fail "with HOME=$home python imports cpcache as \"$got\", want $usersite/cpcache/__init__.py $version"
echo "install-test: make install PREFIX=\$HOME/.local: $PYTHON imports cpcache $version from its user site $usersite"
