"""Engine-owned L1 slots through the Python binding (l1_mode="engine_owned"): the engine's
allocator gives the slots, writes the KV into its per-layer numpy buffers, inserts with them,
takes back every slot the cache lets go, and loads back into slots it allocates."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

SPEC = "layers=2;k=16:sharded;v=16:sharded"  # 64 bytes a token, 256 a page of 4 tokens
PAGE_TOKENS, L1_PAGES = 4, 8


def one_rank(tmp_path, **kw):
    args = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PAGE_TOKENS, l1_pages=L1_PAGES, l2_pages=16,
                l1_mode="engine_owned")
    args.update(kw)
    return cpcache.Cache(**args)


class Allocator:
    """The engine's slot allocator: fails the test on a slot handed back that is not out."""

    def __init__(self, size):
        self.free, self.out = list(range(size - 1, -1, -1)), set()

    def take(self, n):
        got = [self.free.pop() for _ in range(n)]
        self.out.update(got)
        return got

    def give_back(self, slots):
        for s in slots:
            assert s in self.out, f"slot {s} handed back but not out (freed twice or never given)"
            self.out.remove(s)
            self.free.append(s)


def test_bad_modes_and_slot_lists_are_named(tmp_path):
    with pytest.raises(cpcache.InvalidError, match="l1_mode 'sideways'"):
        one_rank(tmp_path, l1_mode="sideways", page_bytes=64)
    with one_rank(tmp_path, l1_mode=None, page_bytes=64) as c:  # the default: the cache picks
        with pytest.raises(cpcache.InvalidError, match="L1 mode"):
            c.insert_slots(list(range(PAGE_TOKENS)), [0])
        assert c.take_freed_l1() == []
    with one_rank(tmp_path, page_bytes=64) as c:
        tokens = list(range(2 * PAGE_TOKENS))
        with pytest.raises(cpcache.InvalidError, match="InsertSlots"):
            c.insert(tokens)
        with pytest.raises(cpcache.InvalidError, match="slot 8 .*outside the L1 pool"):
            c.insert_slots(tokens, [0, L1_PAGES])
        with pytest.raises(cpcache.InvalidError, match=r"slot 2 \(entry 1"):
            c.insert_slots(tokens, [2, 2])
        with pytest.raises(cpcache.InvalidError, match="1 slots for the 2 pages"):
            c.insert_slots(tokens, [2])
        with pytest.raises(cpcache.InvalidError, match="slot 1 .*not an int32"):
            c.insert_slots(tokens, [0, 2**40])
        assert c.stats()["l1_used"] == 0  # nothing changed


def test_engine_owned_flow_returns_every_slot(tmp_path):
    np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    arrays = {(l, j): np.zeros((L1_PAGES * PAGE_TOKENS, 16), dtype=np.uint8) for l in range(2) for j in range(2)}
    alloc = Allocator(L1_PAGES)
    with one_rank(tmp_path, kv_layout=SPEC, l1_buffers=[(l, j, a) for (l, j), a in arrays.items()]) as c:
        tokens = np.arange(500, 500 + 3 * PAGE_TOKENS, dtype=np.int32)
        own = alloc.take(3)  # before the forward pass: out_cache_loc
        want = {}
        for i, slot in enumerate(own):  # the forward writes the KV into the engine's slots
            for (l, j), a in arrays.items():
                v = 1 + i * 16 + l * 4 + j
                a[slot * PAGE_TOKENS:(slot + 1) * PAGE_TOKENS] = v
                want[(i, l, j)] = v
        res = c.insert_slots(tokens, np.array(own, dtype=np.int32))
        assert res.pages == 3 and res.freed == []
        assert c.l1_used_by(0) == 3
        with pytest.raises(cpcache.InvalidError, match="CP rank 1"):
            c.l1_used_by(1)
        assert c.match(tokens).l1_slots == own
        again = alloc.take(3)  # the same pages again: already in L1, all three come back
        res = c.insert_slots(tokens, again)
        assert sorted(res.freed) == sorted(again)
        alloc.give_back(res.freed)
        while c.pending():
            c.step()
        alloc.give_back(c.take_freed_l1())
        for a in arrays.values():
            a[:] = 0
        ev = c.evict_l1_slots(3)
        assert ev.freed == 3 and ev.pending == 0 and sorted(ev.slots) == sorted(own)
        alloc.give_back(ev.slots)
        assert not alloc.out
        m = c.match(tokens)
        assert m.host_pages == 3
        c.lock(m.node)
        plan = c.load_back_plan(m.node)
        assert plan == [0, 1, 2]
        dst = alloc.take(len(plan))
        with pytest.raises(cpcache.InvalidError, match=f"slot {dst[0]} "):
            c.load_back_slots(m.node, [dst[0], dst[0], dst[1]])
        loaded = c.load_back_slots(m.node, dst)
        assert loaded.pages == 3 and loaded.freed == []
        while c.load_pending(m.node):
            c.step()
        c.wait_l1(m.node)
        assert c.match(tokens).l1_slots == dst
        for i, slot in enumerate(dst):  # every layer and part landed in the engine's slots
            for (l, j), a in arrays.items():
                assert (a[slot * PAGE_TOKENS:(slot + 1) * PAGE_TOKENS] == want[(i, l, j)]).all(), (i, l, j)
        c.unlock(m.node)
        c.flush()
        alloc.give_back(c.take_freed_l1())
        assert not alloc.out, f"slots never handed back: {sorted(alloc.out)}"


@pytest.mark.parametrize("kv_buffers", [False, True])
def test_example_engine_slots_under_launch(kv_buffers):
    """The Python example's engine-owned flow on 4 CP ranks: pages evicted and loaded back
    into the engine's slots hold their bytes, and after the final flush every slot is back."""
    import re
    import shutil
    import subprocess
    if kv_buffers:
        pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    binary = os.environ.get("CPCACHE_BIN") or os.path.join(ROOT, "bin", "cpcache")
    if not os.access(binary, os.X_OK):
        binary = shutil.which("cpcache") or binary
    example = os.path.join(ROOT, "python", "examples", "hicache_controller.py")
    cmd = [binary, "launch", "-n", "4", "--", sys.executable, example, "--attn-cp", "4", "--engine-slots"]
    out = subprocess.run(cmd + (["--kv-buffers"] if kv_buffers else []), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [line for line in out.stdout.splitlines() if "requests=" in line]
    assert len(reports) == 4, out.stdout
    for line in reports:
        kv = dict(re.findall(r"(\w+)=([\d.]+)", line))
        assert kv["bad_pages"] == "0" and kv["slots_out"] == "0" and kv["bad_slots"] == "0", line
        assert int(kv["pages_verified"]) > 0 and int(kv["tokens_hit_l2"]) > 0, line
