"""pytest suite of the Python binding: bad calls and the storage round trip in this process
(a world of one rank), the SGLang-style example on 4 ranks under `cpcache launch`, and Ctrl-C.

Needs libcpcache.so (make capi, or CPCACHE_LIBRARY) and the cpcache binary (CPCACHE_BIN, else
the repository's bin/cpcache, else the cpcache on PATH that make install put there). Run with Debian's interpreter: /usr/bin/python3 -m pytest python/tests
"""

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

EXAMPLE = os.path.join(ROOT, "python", "examples", "hicache_controller.py")

def _cpcache_bin():
    if os.environ.get("CPCACHE_BIN"):
        return os.environ["CPCACHE_BIN"]
    built = os.path.join(ROOT, "bin", "cpcache")
    return built if os.access(built, os.X_OK) else (shutil.which("cpcache") or built)


CPCACHE_BIN = _cpcache_bin()


def one_rank(tmp_path, **kw):
    args = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16)
    args.update(kw)
    return cpcache.Cache(**args)


def test_version_is_the_version_file():
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert cpcache.version() == f.read().strip()


def test_bad_calls_raise_typed_errors(tmp_path):
    with pytest.raises(cpcache.InvalidError, match="page_bytes 0"):
        one_rank(tmp_path, page_bytes=0)
    with pytest.raises(cpcache.InvalidError, match="l1_base is None"):
        one_rank(tmp_path, l1_kind=cpcache.L1_HOST)
    with pytest.raises(cpcache.ConfigError):
        one_rank(tmp_path, attn_cp=2)  # does not divide a world of one
    c = one_rank(tmp_path)
    try:
        with pytest.raises(cpcache.AlreadyOpenError):
            one_rank(tmp_path)
        with pytest.raises(cpcache.RangeError):
            c.l1_page(8)
        with pytest.raises(cpcache.NodeError):
            c.lock(0)
        with pytest.raises(cpcache.InvalidError):
            c.evict_l1(-1)
        # A stats struct of the wrong size is refused, not overrun.
        small = (ctypes.c_uint32 * 4)(8)
        assert cpcache.library().cpcache_get_stats(c._h, ctypes.cast(small, ctypes.POINTER(cpcache._Stats))) == -2
        # A correct round trip: the bytes written into the fill pages are what L1 holds.
        tokens = list(range(100, 116))
        res = c.insert(tokens)
        assert res.pages == 4 and all(p.owned for p in res.fill)
        for p in res.fill:
            c.l1_page(p.slot)[:] = bytes([p.index + 1]) * 64
        c.step()
        m = c.match(tokens)
        assert m.node == res.node and m.device_pages == 4
        assert [bytes(c.l1_page(s))[0] for s in m.l1_slots] == [1, 2, 3, 4]
        c.lock(m.node)
        while c.pending():
            c.step()
        with pytest.raises(cpcache.BusyError):
            c.flush()
        c.unlock(m.node)
        c.flush()
        with pytest.raises(cpcache.NodeError, match="before a flush"):
            c.lock(m.node)
    finally:
        c.close()
    c.close()  # idempotent
    with pytest.raises(cpcache.ClosedError):
        c.step()
    with pytest.raises(cpcache.ClosedError):
        c.match([1, 2, 3, 4])


class _Index:
    """An integer that is not an int (as numpy.int64): it has __index__."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_out_of_range_values_are_refused_not_wrapped(tmp_path):
    """ctypes keeps the low bits of an int out of range: page_tokens 2**32 + 4 became 4, a
    token 2**32 + 5 became 5, and an int64 or float buffer was read as int32 tokens. The
    binding refuses them, naming the value, and matches the tokens it was given."""
    import array
    with pytest.raises(cpcache.InvalidError, match="page_tokens 4294967300"):
        one_rank(tmp_path, page_tokens=2**32 + 4)
    with pytest.raises(cpcache.InvalidError, match="l1_pages 9223372036854775808"):
        one_rank(tmp_path, l1_pages=2**63)
    c = one_rank(tmp_path)
    try:
        tokens = list(range(200, 216))
        res = c.insert(array.array("i", tokens))  # a native int32 buffer: no copy
        c.step()
        for same in (tokens, tuple(tokens), array.array("q", tokens), array.array("h", tokens)):
            m = c.match(same)
            assert m.node == res.node and m.device_pages == 4, (same, m)
        for bad in ([1, 2, 2**32 + 5, 4], [1, 2, -2**31 - 1, 4], array.array("f", [1.0, 2.0, 3.0, 4.0]), [1, 2, 3.0, 4]):
            with pytest.raises(cpcache.InvalidError, match="not an int32"):
                c.match(bad)
            with pytest.raises(cpcache.InvalidError, match="not an int32"):
                c.insert(bad)
        with pytest.raises(cpcache.InvalidError, match="pages 18446744073709551615"):
            c.evict_l1(2**64 - 1)  # would have been -1
        with pytest.raises(cpcache.InvalidError, match="node -1"):
            c.lock(-1)
        with pytest.raises(cpcache.InvalidError, match="slot 4294967296"):
            c.l1_page(2**32)  # would have been slot 0
        assert c.stats()["matches"] == 4
        # Integers of another type (numpy's: they have __index__, and are not int) are
        # tokens too, as ctypes took them.
        m = c.match([_Index(t) for t in tokens])
        assert m.node == res.node and m.device_pages == 4, m
    finally:
        c.close()


def test_four_ranks_under_launch():
    out = subprocess.run([CPCACHE_BIN, "launch", "-n", "4", "--", sys.executable, EXAMPLE, "--attn-cp", "4"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [line for line in out.stdout.splitlines() if "requests=" in line]
    assert len(reports) == 4, out.stdout
    for line in reports:
        kv = dict(re.findall(r"(\w+)=([\d.]+)", line))
        assert kv["bad_pages"] == "0" and kv["digest_mismatches"] == "0", line
        assert int(kv["pages_verified"]) > 0 and int(kv["tokens_hit_l2"]) > 0, line
        assert kv["scheduler_steps"] == kv["consensus_steps"], line
    # Every rank of the replica made the same decisions.
    strip = [re.sub(r"^\[\d\] rank \d/4 \(cp \d/4, dp 0\): ", "", r) for r in reports]
    assert all(re.sub(r"pages_(written|loaded)_l2=\d+ ", "", s) == re.sub(r"pages_(written|loaded)_l2=\d+ ", "", strip[0]) for s in strip)


_STORAGE_RANK = """
import os, sys
sys.path.insert(0, {python!r})
import cpcache
try:
    cpcache.Cache(page_bytes=64, l1_pages=8, l2_pages=16, page_tokens=4, attn_cp=2, timeout_ms=20000,
                  storage_url="file://" + {l3!r}, model="m").close()
    print("opened", flush=True)
except cpcache.Error as e:
    print(type(e).__name__ + ": " + str(e), flush=True)
"""


def test_storage_is_agreed_by_every_rank(tmp_path):
    """Opening the storage is agreed: a rank whose open fails must not leave the others with
    PeerLostError and no cause, and ranks with different MAC keys must not open stores whose
    pages each rejects (and deletes) as forged. Every rank gets the same verdict."""
    script = tmp_path / "rank.py"
    script.write_text(_STORAGE_RANK.format(python=os.path.join(ROOT, "python"), l3=str(tmp_path / "l3")))
    for i in range(2):
        (tmp_path / f"k{i}").write_text(os.urandom(32).hex())
        os.chmod(tmp_path / f"k{i}", 0o600)
    (tmp_path / "bad").write_text("too short")
    os.chmod(tmp_path / "bad", 0o600)

    def launch(key_of_rank):
        cmd = f'CPCACHE_STORAGE_KEY_FILE={tmp_path}/{key_of_rank} exec {sys.executable} {script}'
        out = subprocess.run([CPCACHE_BIN, "launch", "-n", "2", "--", "sh", "-c", cmd],
                             capture_output=True, text=True, timeout=120)
        lines = sorted(line for line in out.stdout.splitlines() if line.startswith("["))
        assert len(lines) == 2, out.stdout + out.stderr
        return lines

    assert launch("k0") == ["[0] opened", "[1] opened"]
    for line in launch("k$RANK"):
        assert "ConfigError" in line and "ranks disagree on the storage" in line and "MAC key fingerprint" in line, line
    r0, r1 = launch('$([ "$RANK" = 1 ] && echo bad || echo k0)')
    assert r1.startswith("[1] ConfigError") and "rank 1 of group world[0,1] could not start: opening the storage" in r1, r1
    assert r0.startswith("[0] PeerLostError") and "rank 1 of group world[0,1] could not start: opening the storage" in r0, r0
    assert "holds 9 bytes of key" in r0, r0  # the failing rank's cause reaches the others


_MEMORY_RANK = """
import os, sys
sys.path.insert(0, {python!r})
import cpcache
l2 = 2**31 - 1 if os.environ["RANK"] == "1" else 16  # rank 1: 128 TiB of L2 slab
try:
    cpcache.Cache(page_bytes=65536, l1_pages=8, l2_pages=l2, page_tokens=4, attn_cp=2, timeout_ms=60000).close()
    print("opened", flush=True)
except cpcache.Error as e:
    print(type(e).__name__ + ": " + str(e), flush=True)
"""


def test_host_memory_check_is_agreed_by_every_rank(tmp_path):
    """A rank whose pools would not fit the host's memory is refused before it allocates them,
    and the others learn why at once instead of waiting for it until their deadline."""
    script = tmp_path / "rank.py"
    script.write_text(_MEMORY_RANK.format(python=os.path.join(ROOT, "python")))
    out = subprocess.run([CPCACHE_BIN, "launch", "-n", "2", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    r0, r1 = sorted(line for line in out.stdout.splitlines() if line.startswith("["))
    want = "rank 1 of group world[0,1] could not start: checking host memory"
    assert r1.startswith("[1] InvalidError") and want in r1 and "l2_pages 2147483647" in r1, r1
    assert r0.startswith("[0] PeerLostError") and want in r0 and "l2_pages 2147483647" in r0, r0


_L1_MEMORY_RANK = """
import os, sys
sys.path.insert(0, {python!r})
import cpcache
l1 = 2**31 - 1 if os.environ["RANK"] == "1" else 8  # rank 1: 128 TiB of L1, more than mmap gives
try:
    cpcache.Cache(page_bytes=65536, l1_pages=l1, l2_pages=16, page_tokens=4, attn_cp=2, timeout_ms=20000).close()
    print("opened", flush=True)
except cpcache.Error as e:
    print(type(e).__name__ + ": " + str(e), flush=True)
"""


def test_l1_pool_too_large_to_map_is_agreed_by_every_rank(tmp_path):
    """A rank whose L1_ALLOC pool the binding cannot map still joins: every rank fails at once
    with its host-memory cause, none waits for it until the deadline."""
    script = tmp_path / "rank.py"
    script.write_text(_L1_MEMORY_RANK.format(python=os.path.join(ROOT, "python")))
    start = time.monotonic()
    out = subprocess.run([CPCACHE_BIN, "launch", "-n", "2", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    r0, r1 = sorted(line for line in out.stdout.splitlines() if line.startswith("["))
    want = "rank 1 of group world[0,1] could not start: checking host memory"
    assert r1.startswith("[1] InvalidError") and want in r1 and "l1_pages 2147483647" in r1, r1
    assert r0.startswith("[0] PeerLostError") and want in r0 and "l1_pages 2147483647" in r0, r0
    assert time.monotonic() - start < 15, "at once, not at the 20 s timeout"


def test_ctrl_c_closes_and_exits_130(tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               CPCACHE_STORE=f"file://{tmp_path}")
    p = subprocess.Popen([sys.executable, EXAMPLE, "--forever"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert "serving until interrupted" in line, line + p.stderr.read()
        time.sleep(0.5)  # inside the serving loop: steps, inserts, loads
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, out + err
    assert "interrupted after" in out and "closing the cache" in out, out
    # No Go runtime crash dump, no Python traceback.
    assert "goroutine " not in err and "Traceback" not in err and "panic" not in err, err


def back_up_and_flush(c, tokens, fill):
    """Inserts tokens (4 pages), fills page i with bytes fill + i, waits until the pages are
    backed up to storage, and flushes L1 and L2: only storage holds them then."""
    res = c.insert(tokens)
    for p in res.fill:
        c.l1_page(p.slot)[:] = bytes([fill + p.index]) * 64
    deadline = time.time() + 10
    while c.stats()["storage_backed_up_pages"] < 4 and time.time() < deadline:
        c.step()
        time.sleep(0.001)
    assert c.stats()["storage_backed_up_pages"] == 4
    while c.pending():
        c.step()
    c.flush()


def settle_prefetch(c, pid):
    """Steps until prefetch pid is over (10 s at most)."""
    deadline = time.time() + 10
    while c.prefetch_pending(pid) and time.time() < deadline:
        c.step()
        time.sleep(0.001)
    assert not c.prefetch_pending(pid)


def test_storage_backs_up_and_prefetches_after_flush(tmp_path):
    """The L3 path through the C ABI: pages backed up to a file:// storage survive a flush
    and come back by prefetch, then load-back, with their bytes."""
    store, l3 = tmp_path / "store", tmp_path / "l3"
    store.mkdir()
    c = one_rank(tmp_path, store=f"file://{store}", storage_url=f"file://{l3}", model="test-model")
    try:
        tokens = list(range(500, 516))
        back_up_and_flush(c, tokens, 0x70)
        assert c.match(tokens).host_pages == 0  # L1 and L2 are empty
        pid = c.prefetch(tokens)
        assert pid != 0
        settle_prefetch(c, pid)
        m = c.match(tokens)
        assert m.host_pages == 4, m
        c.lock(m.node)
        assert c.load_back(m.node) == 4
        with pytest.raises(cpcache.NotStartedError):
            c.wait_l1(m.node, 0)
        deadline = time.time() + 10
        while c.load_pending(m.node) and time.time() < deadline:
            c.step()
            time.sleep(0.001)
        m = c.match(tokens)
        c.wait_l1(m.node)
        assert [bytes(c.l1_page(s)) for s in m.l1_slots] == [bytes([0x70 + i]) * 64 for i in range(4)]
        assert c.stats()["storage_prefetched_pages"] == 4
        c.unlock(m.node)
    finally:
        c.close()


def test_prefetch_revoke_stops_a_prefetch(tmp_path):
    """prefetch_revoke (C: cpcache_prefetch_revoke) was missing from the binding. A prefetch
    revoked before its query is answered brings nothing (best-effort: the prefix every rank
    read, none), and prefetch_pending turns false; the same prefetch not revoked brings the 4
    stored pages. Revoking a finished prefetch or 0 changes nothing."""
    store, l3 = tmp_path / "store", tmp_path / "l3"
    store.mkdir()
    c = one_rank(tmp_path, store=f"file://{store}", storage_url=f"file://{l3}", model="test-model")
    try:
        tokens = list(range(600, 616))
        back_up_and_flush(c, tokens, 0x30)
        pid = c.prefetch(tokens)
        assert pid != 0
        c.prefetch_revoke(pid)
        settle_prefetch(c, pid)
        assert c.match(tokens).host_pages == 0
        assert c.stats()["storage_prefetched_pages"] == 0
        pid = c.prefetch(tokens)
        settle_prefetch(c, pid)
        c.prefetch_revoke(pid)
        c.prefetch_revoke(0)
        assert c.match(tokens).host_pages == 4
        assert c.stats()["storage_prefetched_pages"] == 4
    finally:
        c.close()


def test_a_cache_dropped_without_close_is_closed(tmp_path):
    """A Cache the program drops without close() must not stay open for the life of the
    process (its slabs, groups and L1 pool leaked, and every later Cache failing with
    AlreadyOpenError). Garbage collection closes it, with a ResourceWarning — but not while
    a memoryview of its L1 pool (l1_page) is alive: that view keeps the Cache, and so the
    memory it points into, open."""
    import gc
    import warnings
    c = one_rank(tmp_path)
    view = c.l1_page(3)
    del c
    gc.collect()
    view[:] = b"\x07" * 64  # the pool is still mapped
    with pytest.raises(cpcache.AlreadyOpenError):
        one_rank(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view.release()
        del view
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "close()" in str(w.message) for w in caught), caught
    one_rank(tmp_path).close()  # the process's one cache was released


_CUDA_RANK = """
import os, sys
sys.path.insert(0, {python!r})
import cpcache
if os.environ["RANK"] == "1":
    os.environ["CPCACHE_CUDA_LIBRARY"] = {nolib!r}  # this rank's CUDA cannot load
try:
    cpcache.Cache(page_bytes=64, l1_pages=8, l2_pages=16, page_tokens=4, attn_cp=2, timeout_ms=20000,
                  pin_host=True).close()
    print("opened", flush=True)
except cpcache.Error as e:
    print(type(e).__name__ + ": " + str(e), flush=True)
"""


def test_cuda_start_is_agreed_by_every_rank(tmp_path):
    """A rank whose CUDA cannot be opened (its driver, its device ordinal) must not fail
    alone, leaving the others to fail at the slab exchange with a lost peer and no cause. Every
    rank names the lowest failing rank and its cause (rank 0 too, on a host without CUDA)."""
    script = tmp_path / "rank.py"
    script.write_text(_CUDA_RANK.format(python=os.path.join(ROOT, "python"), nolib=str(tmp_path / "no-libcuda.so")))
    out = subprocess.run([CPCACHE_BIN, "launch", "-n", "2", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("["))
    assert len(lines) == 2, out.stdout + out.stderr
    failing = re.findall(r"rank (\d) of group world\[0,1\] could not start: opening CUDA", "\n".join(lines))
    assert len(failing) == 2 and failing[0] == failing[1], lines


def test_open_compares_the_configuration_of_every_rank(tmp_path):
    """cpcache.h promises that open compares every rank's configuration, storage_url and model
    included; ranks with two storage URLs or two models must not open, each serving the other's
    misses from another store or namespace. Every rank fails alike with ConfigError naming
    the field and both values, a URL's password masked."""
    from open_ranks import open_two_ranks
    l3 = f"file://{tmp_path}/l3"

    def launch(rank0, rank1):
        return open_two_ranks(CPCACHE_BIN, dict(page_bytes=64, l1_pages=8, l2_pages=16, page_tokens=4, attn_cp=2, timeout_ms=20000),
                              rank0, rank1)

    lines, _ = launch(dict(storage_url=l3, model="m"), dict(storage_url=l3, model="m"))
    assert lines == ["[0] opened", "[1] opened"], lines
    for rank1, want in (
            (dict(storage_url=l3, model="other"), 'ranks disagree on model: rank 0 has "m", rank 1 has "other"'),
            (dict(storage_url=l3 + "2", model="m"), f'ranks disagree on storage_url: rank 0 has "{l3}", rank 1 has "{l3}2"'),
            (dict(model="m"), f'ranks disagree on storage_url: rank 0 has "{l3}", rank 1 has None'),
            (dict(storage_url=l3, model="m", l1_pages=16), "ranks disagree on l1_pages: rank 0 has 8, rank 1 has 16")):
        lines, _ = launch(dict(storage_url=l3, model="m"), rank1)
        for line in lines:
            assert "ConfigError" in line and want in line, (rank1, line)
    # Two Redis URLs that differ in their password: named, the passwords never printed.
    lines, out = launch(dict(storage_url="redis://:hunter2@127.0.0.1:1/p"), dict(storage_url="redis://:swordfish@127.0.0.1:1/p"))
    for line in lines:
        assert "ConfigError" in line and "storage_url" in line and "differ only in a secret" in line, line
    assert "hunter2" not in out and "swordfish" not in out, out


_STALE_VIEW = """
import sys, tempfile
sys.path.insert(0, {python!r})
import cpcache
store = "file://" + tempfile.mkdtemp()
c = cpcache.Cache(world=1, rank=0, store=store, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16)
view = c.l1_page(0)
c.close()
try:
    view[:] = b"\\x01" * 64
    print("wrote after close", flush=True)
except ValueError as e:
    print("ValueError:", e, flush=True)
c2 = cpcache.Cache(world=1, rank=0, store=store, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16)
try:
    view[:] = b"\\x09" * 64
except ValueError:
    pass
print("new L1 slot 0:", bytes(c2.l1_page(0))[:4].hex(), flush=True)
c2.close()
"""


def test_l1_views_die_with_their_cache(tmp_path):
    """A memoryview from l1_page() must not stay usable after close(): writing to it would
    segfault the interpreter (the pool is unmapped), and after a reopen write into the new
    cache's L1. close() releases every view it handed out (ValueError on use); a buffer derived from
    one keeps the old pool mapped, detached: it never faults and never reaches a new cache."""
    script = tmp_path / "stale.py"
    script.write_text(_STALE_VIEW.format(python=os.path.join(ROOT, "python")))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.returncode, out.stdout + out.stderr)
    assert "ValueError: operation forbidden on released memoryview" in out.stdout, out.stdout
    assert "new L1 slot 0: 00000000" in out.stdout, out.stdout

    import warnings
    c = one_rank(tmp_path)
    view, other = c.l1_page(1), c.l1_page(2)
    derived = view[8:16]  # a slice: another view of the same buffer, not releasable from here
    taken = ctypes.c_char.from_buffer(other)  # a buffer taken from the view, as numpy takes one
    derived[:] = b"\x05" * 8
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.close()
    assert any(issubclass(w.category, ResourceWarning) and "derived" in str(w.message) for w in caught), caught
    with pytest.raises(ValueError):
        view[0] = 1
    with pytest.raises(ValueError):
        bytes(view)
    with pytest.raises(cpcache.ClosedError):
        c.l1_page(1)
    c2 = one_rank(tmp_path)
    try:
        derived[:] = b"\x06" * 8  # the old, detached pool: no fault
        taken.value = b"\x07"
        assert bytes(derived) == b"\x06" * 8
        for slot in range(8):
            assert bytes(c2.l1_page(slot)) == bytes(64), slot  # the new pool is untouched
    finally:
        c2.close()
    del derived, taken, other
    # Without derived buffers close() unmaps the pool and warns of nothing.
    c3 = one_rank(tmp_path)
    v3 = c3.l1_page(0)
    v3[:] = b"\x01" * 64
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c3.close()
    assert not caught, caught
    with pytest.raises(ValueError):
        v3[0]


def _settle(c):
    for _ in range(10000):
        c.step()
        if c.pending() == 0:
            return
        time.sleep(0.001)
    raise AssertionError("transfers never ended")


def _host_only(c, tokens):
    """Inserts tokens, lets the backups commit, evicts them from L1: held in L2 only."""
    res = c.insert(tokens)
    for p in res.fill:
        c.l1_page(p.slot)[:] = bytes([p.index + 1]) * 64
    _settle(c)
    pages = len(tokens) // 4
    assert c.evict_l1(pages) == (pages, 0)
    m = c.match(tokens)
    assert (m.device_pages, m.host_pages) == (0, pages)


def _load(c, tokens):
    """Matches tokens, loads the host hit back and waits for it; returns (hit, loaded)."""
    m = c.match(tokens)
    c.lock(m.node)
    loaded = c.load_back(m.node)
    while c.load_pending(m.node):
        c.step()
    c.unlock(m.node)
    return m, loaded


def test_load_back_loads_the_matched_pages(tmp_path):
    """A request sharing 3 pages with an 8-page sequence held only in L2 hits 3 host pages;
    load_back must not load all 8 into L1. It loads the 3 (the match ends the node there),
    with the bytes written at insert; the other 5 stay in L2."""
    c = one_rank(tmp_path, l1_pages=32, l2_pages=64)
    try:
        long = list(range(1, 33))
        _host_only(c, long)
        m, loaded = _load(c, long[:12] + [9000 + t for t in range(12)])
        assert (m.host_pages, loaded) == (3, 3)
        assert c.stats()["l1_used"] == 3 and c.stats()["loaded_pages"] == 3
        m = c.match(long)
        assert (m.device_pages, m.host_pages) == (3, 5)
        for i, slot in enumerate(m.l1_slots):
            assert bytes(c.l1_page(slot)) == bytes([i + 1]) * 64
    finally:
        c.close()


def test_layer_wise_waits(tmp_path):
    """wait_l1_layer follows wait_l1's rules (not started before the step, a bad layer and a
    stale node refused, typed); with the library's host engine, which loads whole pages, every
    layer is ready once the load is, with the bytes inserted. wait_l1_layer_on needs a device
    L1: on host memory it is a ConfigError, and a stream that is no handle is refused."""
    c = one_rank(tmp_path, l1_pages=16, l2_pages=32)
    try:
        tokens = list(range(700, 716))
        _host_only(c, tokens)
        m = c.match(tokens)
        c.lock(m.node)
        assert c.load_back(m.node) == 4
        with pytest.raises(cpcache.NotStartedError):
            c.wait_l1_layer(m.node, 0, 0)
        with pytest.raises(cpcache.InvalidError, match="layer -1"):
            c.wait_l1_layer(m.node, -1)
        with pytest.raises(cpcache.InvalidError, match="layer 2147483648"):
            c.wait_l1_layer(m.node, 2**31)
        with pytest.raises(cpcache.NodeError):
            c.wait_l1_layer(12345, 0, 0)
        with pytest.raises(cpcache.ConfigError, match="stream"):
            c.wait_l1_layer_on(m.node, 0, 0)

        class _Stream:  # as torch.cuda.Stream: its handle in cuda_stream
            cuda_stream = 0
        with pytest.raises(cpcache.ConfigError, match="stream"):
            c.wait_l1_layer_on(m.node, 0, _Stream())
        for bad in ("stream", -1, 2**64):
            with pytest.raises(cpcache.InvalidError, match="stream"):
                c.wait_l1_layer_on(m.node, 0, bad)
        c.step()  # starts the copies
        for layer in (0, 31):
            c.wait_l1_layer(m.node, layer, 10000)
        while c.load_pending(m.node):
            c.step()
        m = c.match(tokens)
        assert m.device_pages == 4
        c.wait_l1_layer(m.node, 0)
        assert [bytes(c.l1_page(s)) for s in m.l1_slots] == [bytes([i + 1]) * 64 for i in range(4)]
        c.unlock(m.node)
    finally:
        c.close()


def test_load_back_of_a_long_host_hit(tmp_path):
    """A 20-page host hit in one node, L1 of 32 pages empty: load_back must not load nothing
    (as it would if the quota, 16 by default, applied to the whole node). It loads the quota's worth,
    16, then the other 4; with load_quota_pages 20 all 20 at once."""
    for quota, first in ((0, 16), (20, 20)):
        c = one_rank(tmp_path, l1_pages=32, l2_pages=64, load_quota_pages=quota)
        try:
            tokens = list(range(500, 580))
            _host_only(c, tokens)
            m, loaded = _load(c, tokens)
            assert (m.host_pages, loaded) == (20, first)
            m, loaded = _load(c, tokens)
            assert (m.device_pages, m.host_pages, loaded) == (first, 20 - first, 20 - first)
            m = c.match(tokens)
            assert (m.device_pages, m.host_pages) == (20, 0)
            for i, slot in enumerate(m.l1_slots):
                assert bytes(c.l1_page(slot)) == bytes([i + 1]) * 64
        finally:
            c.close()


def test_evict_l1_under_write_back_reports_pending(tmp_path):
    """Under write_back, evict_l1(2) reported 0 (the pages pending their backup were left
    out) and a caller asking again started more: 4 pages evicted where 2 were wanted. It
    reports Evicted(freed=0, pending=2); asking again starts nothing; after the commit L1
    has exactly 2 pages more."""
    c = one_rank(tmp_path, l1_pages=16, l2_pages=32, policy=cpcache.WRITE_BACK)
    try:
        tokens = list(range(700, 732))
        c.insert(tokens)
        c.step()
        assert c.evict_l1(2) == cpcache.Evicted(freed=0, pending=2)
        assert c.evict_l1(2) == (0, 2)
        _settle(c)
        st = c.stats()
        assert (st["l1_used"], st["evicted_l1_pages"], st["written_pages"]) == (6, 2, 2)
        m = c.match(tokens)
        assert (m.device_pages, m.host_pages) == (6, 2)
    finally:
        c.close()


_ISOLATION_RANK = """
import os, sys, time
sys.path.insert(0, {python!r})
import cpcache
c = cpcache.Cache(page_bytes=64, l1_pages=32, l2_pages=64, page_tokens=4, attn_cp=4, timeout_ms=20000,
                  storage_url={l3!r}, model="isolation-test")
rank = int(os.environ["RANK"])
seqs = [list(range(1000 + 40 * i, 1000 + 40 * i + 16)) for i in range(3)]
pages = sum(len(s) // 4 for s in seqs)

def steps_while(cond):
    for _ in range(20000):
        if not cond():
            return
        c.step()
        time.sleep(0.0005)
    raise SystemExit("[%d] no progress" % rank)

def hits(key):
    ms = [c.match(s, key=key) for s in seqs]
    return sum(m.device_pages for m in ms), sum(m.host_pages for m in ms)

def prefetch_all(key):
    for s in seqs:
        pid = c.prefetch(s, key=key)
        steps_while(lambda: c.prefetch_pending(pid))

for s in seqs:
    for p in c.insert(s, key=b"tenant-a").fill:
        if p.owned:
            c.l1_page(p.slot)[:] = bytes([p.index]) * 64
steps_while(lambda: c.pending() or c.stats()["storage_backed_up_pages"] < pages)
out = ["L1", hits(b"tenant-b"), hits(None), hits("tenant-a")]
c.evict_l1(1 << 20)
steps_while(c.pending)
out += ["L2", hits(b"tenant-b"), hits(b"tenant-a")]
c.flush()
prefetch_all(b"tenant-b")
out += ["L3", hits(b"tenant-b")]
prefetch_all(b"tenant-a")
out += [hits(b"tenant-a")]
for s in seqs:
    for p in c.insert(s, key=b"tenant-b").fill:
        if p.owned:
            c.l1_page(p.slot)[:] = bytes([p.index]) * 64
c.step()
out += ["own", hits(b"tenant-b"), c.stats()["l1_hit_pages"]]
print("[%d] %r" % (rank, out), flush=True)
c.close()
"""


def test_isolation_key_shares_no_page(tmp_path):
    """Four CP ranks under cpcache launch with storage: a second isolation key gets 0 hits on
    the first key's prompts in L1, in L2 and in storage (after a flush), the empty key too,
    while the first key's repeats hit in every tier and the second key's own repeat hits;
    every rank sees the same."""
    script = tmp_path / "rank.py"
    script.write_text(_ISOLATION_RANK.format(python=os.path.join(ROOT, "python"), l3=f"file://{tmp_path / 'l3'}"))
    out = subprocess.run([CPCACHE_BIN, "launch", "-n", "4", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("["))
    assert out.returncode == 0 and len(lines) == 4, out.stdout + out.stderr
    want = ["L1", (0, 0), (0, 0), (12, 0), "L2", (0, 0), (0, 12), "L3", (0, 0), (0, 12), "own", (12, 0)]
    results = [eval(line[line.index("['"):]) for line in lines]  # after the launcher's "[rank] " and the script's
    for rank, r in enumerate(results):
        assert r[:-1] == want, (rank, r)
        assert r[-1] == results[0][-1], (rank, r)
