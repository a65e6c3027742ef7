"""The PEP 517 backend of pyproject.toml: builds cpcache's wheel with the standard library.

The wheel holds the binding (python/cpcache/__init__.py), libcpcache.so beside it (the
binding loads the library next to itself) and the cpcache binary as a script (so that
`cpcache launch` is on the virtual environment's PATH). The library links Gloo and hiredis
from the system (Debian: libgloo-dev, libhiredis-dev), so the wheel is tagged for this
platform only (py3-none-linux_<machine>), not manylinux.

Inputs, from the repository root: VERSION, pyproject.toml's [project] table, LICENSE,
build/libcpcache.so (make capi) and bin/cpcache (make build), or the files that
$CPCACHE_LIBRARY and $CPCACHE_BIN name.
"""

import base64
import hashlib
import os
import sysconfig
import tomllib
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.read().strip()


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _tag():
    return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _input(env, default, how):
    path = os.environ.get(env) or os.path.join(ROOT, default)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"cpcache wheel: {path} not found: {how} (or set {env})")
    return path


def _metadata(version):
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {version}",
             f"Summary: {p['description']}", f"License: {p['license']['text']}",
             f"Requires-Python: {p['requires-python']}"]
    lines += [f"Classifier: {c}" for c in p.get("classifiers", [])]
    lines += [f"Project-URL: {k}, {v}" for k, v in p.get("urls", {}).items()]
    return "\n".join(lines) + "\n"


def _wheel_name(version):
    return f"cpcache-{version}-{_tag()}.whl"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    dist_info = f"cpcache-{version}.dist-info"
    files = [  # (name in the wheel, bytes, mode)
        ("cpcache/__init__.py", open(os.path.join(ROOT, "python", "cpcache", "__init__.py"), "rb").read(), 0o644),
        ("cpcache/libcpcache.so", open(_input("CPCACHE_LIBRARY", "build/libcpcache.so", "run make capi"), "rb").read(), 0o755),
        (f"cpcache-{version}.data/scripts/cpcache", open(_input("CPCACHE_BIN", "bin/cpcache", "run make build"), "rb").read(), 0o755),
        (f"{dist_info}/METADATA", _metadata(version).encode(), 0o644),
        (f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: cpcache_wheel\nRoot-Is-Purelib: false\nTag: {_tag()}\n".encode(), 0o644),
        (f"{dist_info}/LICENSE", open(os.path.join(ROOT, "LICENSE"), "rb").read(), 0o644),
    ]
    record = []
    for name, data, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    os.makedirs(wheel_directory, exist_ok=True)
    name = _wheel_name(version)
    path = os.path.join(wheel_directory, name)
    with zipfile.ZipFile(path + ".part", "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in files:
            info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(path + ".part", path)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


if __name__ == "__main__":  # make wheel: python3 python/build_backend/cpcache_wheel.py dist
    import sys
    print(os.path.join(sys.argv[1], build_wheel(sys.argv[1])))
