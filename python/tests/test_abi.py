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


def test_an_abi2_config_opens_with_the_abi3_fields_defaulted(tmp_path):
    """A caller built against the ABI-2 header: every field before store, struct_size its
    size (CPCACHE_CONFIG_SIZE_V2), abi_version 2. It opens; that size with abi_version 3 and
    the ABI-3 size with abi_version 2 do not (CPCACHE_ERR_SIZE naming the ABI-2 pair)."""
    import ctypes
    abi3 = {"store", "job_id", "local_world", "kv_events_endpoint", "kv_events_replay_endpoint", "kv_events_topic",
            "metrics_addr"}

    class ConfigV2(ctypes.Structure):
        _fields_ = [f for f in cpcache._Config._fields_ if f[0] not in abi3]

    assert ctypes.sizeof(ConfigV2) == cpcache._Config.store.offset
    lib = cpcache.library()
    full = cpcache._Config()
    assert lib.cpcache_config_init(ctypes.byref(full)) == 0
    assert full.struct_size == ctypes.sizeof(cpcache._Config) and full.abi_version == 3
    old = ConfigV2()
    ctypes.memmove(ctypes.byref(old), ctypes.byref(full), ctypes.sizeof(ConfigV2))
    old.world, old.rank, old.store_url = 1, 0, f"file://{tmp_path}".encode()
    old.page_tokens, old.page_bytes, old.l1_pages, old.l2_pages = 4, 64, 8, 16
    as_cfg = ctypes.cast(ctypes.byref(old), ctypes.POINTER(cpcache._Config))
    h = ctypes.c_uint64()
    old.struct_size, old.abi_version = ctypes.sizeof(ConfigV2), 3
    assert lib.cpcache_open(as_cfg, ctypes.byref(h)) == -2  # CPCACHE_ERR_SIZE
    assert b"ABI-2 config (%d, 2)" % ctypes.sizeof(ConfigV2) in lib.cpcache_last_error()
    old.abi_version = 2
    assert lib.cpcache_open(as_cfg, ctypes.byref(h)) == 0, lib.cpcache_last_error()
    try:
        info = cpcache._Info(struct_size=ctypes.sizeof(cpcache._Info))
        assert lib.cpcache_get_info(h.value, ctypes.byref(info)) == 0 and info.page_bytes == 64
    finally:
        assert lib.cpcache_close(h.value) == 0
