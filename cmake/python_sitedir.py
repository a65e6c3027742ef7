"""Prints where the Python package goes under an install prefix, relative to it, as the
interpreter that runs this script sees it (CMakeLists.txt runs it with Python3_EXECUTABLE).

- The prefix is the interpreter's user base (~/.local, or $PYTHONUSERBASE): its user site,
  `python3 -m site --user-site` (lib/python3.X/site-packages, Debian's python3 included).
- Debian's python3 and its own prefix (/usr): lib/python3/dist-packages (the deb_system scheme).
- The interpreter's own platlib lies under the prefix: that (Debian's python3 and /usr/local:
  lib/python3.X/dist-packages; a virtual environment's prefix: its site-packages).
- Otherwise the prefix's standard layout, lib/python3.X/site-packages (the posix_prefix scheme).

Usage: python3 cmake/python_sitedir.py PREFIX
"""

import os
import site
import sys
import sysconfig


def sitedir(prefix):
    p = os.path.realpath(prefix)
    if p == os.path.realpath(site.getuserbase()):
        get = getattr(sysconfig, "get_preferred_scheme", None)  # Python 3.10+
        scheme = get("user") if get else f"{os.name}_user"
        d = sysconfig.get_path("platlib", scheme)
    elif p == os.path.realpath(sys.base_prefix) and "deb_system" in sysconfig.get_scheme_names():
        d = sysconfig.get_path("platlib", "deb_system")  # Debian's python3 and /usr
    else:
        d = sysconfig.get_path("platlib")
        if os.path.commonpath([os.path.realpath(d), p]) != p:
            d = sysconfig.get_path("platlib", "posix_prefix", vars={"base": p, "platbase": p})
    return os.path.relpath(os.path.realpath(d), p)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1]:
        sys.exit(f"usage: {sys.argv[0]} PREFIX, got {sys.argv[1:]}")
    print(sitedir(sys.argv[1]))
