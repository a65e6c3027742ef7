"""The C ABI's one list of entry points: the functions include/cpcache.h declares are exactly
csrc/cpcache_entries.h's (plus the three that return no status, which csrc/cpcache_capi.c
defines itself), exactly the cpcache_* functions libcpcache.so exports, and exactly those the
Python binding declares. Each public function is a C wrapper with the fork check in front of
the Go function cpcapi_<name>, so a function that bypassed the list would bypass the check."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

NO_STATUS = {"cpcache_version", "cpcache_abi_version", "cpcache_last_error"}


def header_functions():
    with open(os.path.join(ROOT, "include", "cpcache.h")) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    block = text.split("#ifndef CPCACHE_NO_PROTOTYPES", 1)[1].split("#endif", 1)[0]
    names = re.findall(r"^\s*(?:const\s+)?\w+\s*\*?\s*(cpcache_\w+)\s*\(", block, flags=re.M)
    assert len(names) == len(set(names)), "a function declared twice"
    return set(names)


def entry_list():
    with open(os.path.join(ROOT, "csrc", "cpcache_entries.h")) as f:
        text = f.read()
    return {"cpcache_" + n for n in re.findall(r"^CPCACHE_ENTRY(?:_PIDCHECK)?\((\w+),", text, flags=re.M)}


def test_entry_list_is_the_header():
    header, entries = header_functions(), entry_list()
    assert len(header) > 30
    assert entries | NO_STATUS == header, (f"in the header only: {sorted(header - entries - NO_STATUS)}; "
                                           f"in csrc/cpcache_entries.h only: {sorted(entries - header)}")


def test_library_exports_the_header():
    if not shutil.which("nm"):
        pytest.skip("nm (binutils) is not installed: the exported symbols cannot be listed")
    lib = cpcache.library()._name
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("cpcache_")}
    header = header_functions()
    assert exported == header, (f"{lib}: exported but not in the header: {sorted(exported - header)}; "
                                f"in the header but not exported: {sorted(header - exported)}")


def test_binding_declares_the_header():
    lib = cpcache.library()
    # ctypes keeps each function it was asked for (getattr) in the CDLL's __dict__.
    declared = {n for n in vars(lib) if n.startswith("cpcache_")}
    assert declared == header_functions()
