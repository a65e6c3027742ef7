"""The PEP 517 backend of pyproject.toml: builds cpcache's wheel with the standard library,
patchelf, strip and readelf (binutils).

The wheel holds:
  cpcache/__init__.py           the binding
  cpcache/sglang.py             SGLang's prefix-cache interface over it
  cpcache/libcpcache.so         the library (the binding loads the one next to itself),
                                RUNPATH $ORIGIN/.libs
  cpcache/bin/cpcache           the cpcache binary, RUNPATH $ORIGIN/../.libs
  cpcache/.libs/                every shared library the two need beyond glibc, libstdc++ and
                                libgcc_s, transitively (Gloo, hiredis, libibverbs, libnl on
                                Debian), each renamed to name-<hash>.so.N with that SONAME and
                                RUNPATH $ORIGIN, as auditwheel repairs a wheel
  scripts/cpcache               a `#!python` script (pip writes the interpreter in) that
                                execs cpcache/bin/cpcache, so that `cpcache launch` is on the
                                environment's PATH wherever pip puts scripts
  dist-info/licenses/           LICENSE, and for each bundled library the copyright file of
                                its Debian package and BUNDLED.txt (library, package,
                                version, source package)

The libraries are bundled as shared objects rather than linked statically: Debian ships no PIC
archives of them (libgloo.a, libibverbs.a do not exist), and a separate .so keeps the LGPL
libnl replaceable. The renamed SONAMEs keep them apart from a copy the process loads itself
(NCCL dlopens the system's libibverbs.so.1 for InfiniBand: it must not get this one).

The platform tag is manylinux_2_Y_<machine>, Y the lowest glibc that both the GLIBC_2.y
symbol versions all the wheel's ELF files need and their libstdc++/libgcc_s symbol versions
(GLIBCXX, CXXABI, GCC) allow, per auditwheel's manylinux policies (_CXX_LIMITS); where they
need more than that table knows, or on a machine it has no table for, linux_<machine>.

Inputs, from the repository root: VERSION, pyproject.toml's [project] table, LICENSE,
build/libcpcache.so (make capi) and bin/cpcache (make build), or the files that
$CPCACHE_LIBRARY and $CPCACHE_BIN name.
"""

import base64
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Libraries every target has and the wheel does not carry: glibc's, the C++ runtime and
# libgcc_s (as manylinux's policies assume).
_SYSTEM = re.compile(r"^(ld-linux[-.\w]*\.so\.\d+|lib(c|m|mvec|pthread|dl|rt|resolv|util|anl)\.so\.\d+"
                     r"|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$")

# auditwheel's manylinux policies for x86_64 (src/auditwheel/policy/manylinux-policy.json):
# glibc minor -> the newest GLIBCXX_3.4.N, CXXABI_1.3.N and GCC_x.y.z that the policy allows
# (the libstdc++ and libgcc_s of that platform's reference distributions).
_CXX_LIMITS = {
    "x86_64": [
        (17, 19, 7, (4, 8, 0)),
        (24, 22, 10, (4, 8, 0)),
        (31, 28, 12, (7, 0, 0)),
        (34, 29, 13, (7, 0, 0)),
        (35, 30, 13, (7, 0, 0)),
        (41, 33, 15, (14, 0, 0)),
    ],
}


class WheelError(Exception):
    """A wheel that cannot be built as promised: a missing tool or input, an unresolved
    library."""


def _version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _machine():
    return platform.machine()


def _input(env, default, how):
    path = os.environ.get(env) or os.path.join(ROOT, default)
    if not os.path.isfile(path):
        raise WheelError(f"cpcache wheel: {path} not found: {how} (or set {env})")
    return path


def _tool(name, package):
    path = shutil.which(name)
    if path is None:
        raise WheelError(f"cpcache wheel: {name} not found on PATH: install it (Debian: {package})")
    return path


def _run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise WheelError(f"cpcache wheel: {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _needed(path):
    return _run(_tool("patchelf", "patchelf"), "--print-needed", path).split()


def _resolve(elfs):
    """Every library the ELF files load, transitively, beyond _SYSTEM: {soname: path}."""
    found = {}
    for elf in elfs:
        for line in _run(_tool("ldd", "libc-bin"), elf).splitlines():
            m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s*(\(0x[0-9a-f]+\))?$", line)
            if not m or _SYSTEM.match(m.group(1)):
                continue
            soname, where = m.group(1), m.group(2)
            if where == "not found":
                raise WheelError(f"cpcache wheel: {elf} needs {soname}, which this machine does not have")
            found[soname] = os.path.realpath(where)
    return found


def _hashed(soname, path):
    """libgloo.so.0 -> libgloo-<8 hex of the file's sha256>.so.0, as auditwheel names them."""
    with open(path, "rb") as f:
        h = hashlib.sha256(f.read()).hexdigest()[:8]
    stem, _, ext = soname.partition(".so")
    return f"{stem}-{h}.so{ext}"


def _symbol_versions(path):
    """The versions the file needs of each library: {library: {version}} (.gnu.version_r)."""
    out = _run(_tool("readelf", "binutils"), "-V", "-W", path)
    needs, lib, inside = {}, None, False
    for line in out.splitlines():
        if line.startswith("Version needs section"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            inside = False
        if not inside:
            continue
        m = re.search(r"File: (\S+)", line)
        if m:
            lib = m.group(1)
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and lib:
            needs.setdefault(lib, set()).add(m.group(1))
    return needs


def _vtuple(s):
    return tuple(int(x) for x in s.split("."))


def platform_tag(elfs, machine=None):
    """The honest platform tag for these ELF files and what decided it: (tag, reason)."""
    machine = machine or _machine()
    versions = {}
    for elf in elfs:
        for lib, names in _symbol_versions(elf).items():
            if _SYSTEM.match(lib):
                versions.setdefault(lib, set()).update(names)
    glibc, cxx, cxxabi, gcc, other = (2, 0), (3, 4), (1, 3), (0,), []
    for lib, names in sorted(versions.items()):
        for n in sorted(names):
            kind, _, num = n.partition("_")
            if not re.fullmatch(r"[0-9.]+", num):
                other.append(f"{n} of {lib}")
            elif kind == "GLIBC":
                glibc = max(glibc, _vtuple(num))
            elif kind == "GLIBCXX":
                cxx = max(cxx, _vtuple(num))
            elif kind == "CXXABI":
                cxxabi = max(cxxabi, _vtuple(num))
            elif kind == "GCC":
                gcc = max(gcc, _vtuple(num))
            else:
                other.append(f"{n} of {lib}")
    need = (f"GLIBC_{'.'.join(map(str, glibc))}, GLIBCXX_{'.'.join(map(str, cxx))}, "
            f"CXXABI_{'.'.join(map(str, cxxabi))}, GCC_{'.'.join(map(str, gcc))}")
    generic = "linux_" + machine
    if other:
        return generic, f"needs {need} and {', '.join(other)}, which no manylinux policy allows"
    floor = None
    for minor, cxx_max, abi_max, gcc_max in _CXX_LIMITS.get(machine, []):
        if cxx <= (3, 4, cxx_max) and cxxabi <= (1, 3, abi_max) and gcc <= gcc_max:
            floor = minor
            break
    if floor is None:
        why = "no manylinux table for " + machine if machine not in _CXX_LIMITS else \
            "a libstdc++ newer than every manylinux policy the table knows"
        return generic, f"needs {need}: {why}"
    y = max(glibc[1] if len(glibc) > 1 else 0, floor)
    return f"manylinux_2_{y}_{machine}", \
        f"needs {need}: glibc 2.{glibc[1]}, libstdc++/libgcc_s of manylinux_2_{floor}"


def _debian_package(path):
    """(package, version, source package, copyright file) of a Debian-installed file, or None."""
    if shutil.which("dpkg-query") is None:
        return None
    cands = [path]
    for a, b in (("/usr/lib/", "/lib/"), ("/lib/", "/usr/lib/")):
        if path.startswith(a):
            cands.append(b + path[len(a):])
    for c in cands:
        r = subprocess.run(["dpkg-query", "-S", c], capture_output=True, text=True)
        if r.returncode == 0:
            pkg = r.stdout.splitlines()[0].split(": ", 1)[0].split(", ")[0]  # libnl-3-200:amd64
            info = _run("dpkg-query", "-W", "-f", "${Version}\t${source:Package}", pkg).split("\t")
            name = pkg.split(":")[0]
            copyright = f"/usr/share/doc/{name}/copyright"
            return name, info[0], info[1], copyright if os.path.isfile(copyright) else None
    return None


def _stage(lib, binary, tmp):
    """Copies the library and the binary into tmp/cpcache, bundles their libraries in
    tmp/cpcache/.libs, strips and patches every file. Returns (ELF files, {bundled name:
    (soname, source path)})."""
    patchelf, strip = _tool("patchelf", "patchelf"), _tool("strip", "binutils")
    pkg = os.path.join(tmp, "cpcache")
    libs = os.path.join(pkg, ".libs")
    os.makedirs(os.path.join(pkg, "bin"))
    os.makedirs(libs)
    top = {os.path.join(pkg, "libcpcache.so"): (lib, "$ORIGIN/.libs"),
           os.path.join(pkg, "bin", "cpcache"): (binary, "$ORIGIN/../.libs")}
    deps = _resolve([lib, binary])
    renamed = {soname: _hashed(soname, path) for soname, path in deps.items()}
    elfs = {}
    for dst, (src, rpath) in top.items():
        shutil.copyfile(src, dst)
        elfs[dst] = rpath
    bundled = {}
    for soname, path in sorted(deps.items()):
        dst = os.path.join(libs, renamed[soname])
        shutil.copyfile(path, dst)
        elfs[dst] = "$ORIGIN"
        bundled[renamed[soname]] = (soname, path)
    for dst, rpath in elfs.items():
        os.chmod(dst, 0o755)
        _run(strip, "--strip-unneeded", dst)
        # One change a call: patchelf 0.14 drops --replace-needed given with --set-rpath.
        replace = []
        for n in _needed(dst):
            if n in renamed:
                replace += ["--replace-needed", n, renamed[n]]
        if replace:
            _run(patchelf, *replace, dst)
        if os.path.dirname(dst) == libs:
            _run(patchelf, "--set-soname", os.path.basename(dst), dst)
        _run(patchelf, "--set-rpath", rpath, dst)
        left = [n for n in _needed(dst) if not _SYSTEM.match(n) and n not in renamed.values()]
        if left:
            raise WheelError(f"cpcache wheel: {dst} still needs {left} from the system")
    return list(elfs), bundled


def _licences(bundled):
    """[(name in dist-info/licenses, bytes)] for the bundled libraries, and BUNDLED.txt."""
    files, lines = [], ["Shared libraries bundled in cpcache/.libs (loaded through $ORIGIN run paths),",
                        "each with its Debian package's copyright file here:", ""]
    for name, (soname, path) in sorted(bundled.items()):
        deb = _debian_package(path)
        if deb is None:
            print(f"cpcache wheel: warning: {path} belongs to no Debian package: "
                  f"add its licence to the wheel by hand", file=sys.stderr)
            lines.append(f"{name}  ({soname}, {path}): package unknown, licence not recorded")
            continue
        pkg, version, source, copyright = deb
        entry = f"{name}  ({soname}): Debian package {pkg} {version}, source {source} {version}"
        if copyright:
            with open(copyright, "rb") as f:
                files.append((f"{pkg}.copyright", f.read()))
            entry += f", licence: {pkg}.copyright"
        lines.append(entry)
    files.append(("BUNDLED.txt", ("\n".join(lines) + "\n").encode()))
    return files


# The console script: finds the installed package without importing it (no library loaded)
# and replaces itself with the binary inside it.
_SCRIPT = '''#!python
"""cpcache's command line: the cpcache binary inside the installed cpcache package."""
import importlib.util
import os
import sys

spec = importlib.util.find_spec("cpcache")
exe = os.path.join(spec.submodule_search_locations[0], "bin", "cpcache") if spec and spec.submodule_search_locations else None
if exe is None or not os.path.isfile(exe):
    sys.exit(f"cpcache: the cpcache package that {sys.executable} imports has no bin/cpcache ({exe})")
os.execv(exe, [sys.argv[0]] + sys.argv[1:])
'''


def _metadata(version):
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {version}",
             f"Summary: {p['description']}", f"License: {p['license']['text']}",
             f"Requires-Python: {p['requires-python']}"]
    lines += [f"Classifier: {c}" for c in p.get("classifiers", [])]
    lines += [f"Project-URL: {k}, {v}" for k, v in p.get("urls", {}).items()]
    return "\n".join(lines) + "\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    dist_info = f"cpcache-{version}.dist-info"
    lib = _input("CPCACHE_LIBRARY", "build/libcpcache.so", "run make capi")
    binary = _input("CPCACHE_BIN", "bin/cpcache", "run make build")
    with tempfile.TemporaryDirectory(prefix="cpcache-wheel-") as tmp:
        elfs, bundled = _stage(lib, binary, tmp)
        tag, why = platform_tag(elfs)
        files = [  # (name in the wheel, bytes, mode)
            (f"cpcache/{name}", open(os.path.join(ROOT, "python", "cpcache", name), "rb").read(), 0o644)
            for name in ("__init__.py", "sglang.py")]
        for elf in sorted(elfs):
            with open(elf, "rb") as f:
                files.append((os.path.relpath(elf, tmp), f.read(), 0o755))
    tag = "py3-none-" + tag
    files += [
        (f"cpcache-{version}.data/scripts/cpcache", _SCRIPT.encode(), 0o755),
        (f"{dist_info}/METADATA", _metadata(version).encode(), 0o644),
        (f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: cpcache_wheel\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(), 0o644),
        (f"{dist_info}/LICENSE", open(os.path.join(ROOT, "LICENSE"), "rb").read(), 0o644),
    ]
    files += [(f"{dist_info}/licenses/{n}", data, 0o644) for n, data in _licences(bundled)]
    record = []
    for name, data, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    os.makedirs(wheel_directory, exist_ok=True)
    name = f"cpcache-{version}-{tag}.whl"
    path = os.path.join(wheel_directory, name)
    with zipfile.ZipFile(path + ".part", "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in files:
            info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(path + ".part", path)
    print(f"cpcache wheel: {name}: {why}; bundled: "
          f"{', '.join(f'{s} as {n}' for n, (s, _) in sorted(bundled.items())) or 'nothing'}", file=sys.stderr)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


if __name__ == "__main__":  # make wheel: python3 python/build_backend/cpcache_wheel.py dist
    try:
        print(os.path.join(sys.argv[1], build_wheel(sys.argv[1])))
    except WheelError as e:
        sys.exit(str(e))
