"""The token-level API: per-token L1 locations (SGLang's out_cache_loc) in and out as int64
arrays (numpy; torch when asked), host hits in tokens, the agreed room-making in one call."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")

PT, L1_PAGES = 4, 8


def one_rank(tmp_path, **kw):
    args = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PT, page_bytes=64, l1_pages=L1_PAGES,
                l2_pages=32, l1_mode="engine_owned")
    args.update(kw)
    return cpcache.Cache(**args)


def locs_of(slots):
    return np.concatenate([np.arange(s * PT, (s + 1) * PT, dtype=np.int64) for s in slots])


def test_match_and_insert_in_token_locations(tmp_path):
    with one_rank(tmp_path) as c:
        tokens = np.arange(100, 100 + 3 * PT + 2, dtype=np.int32)  # 3 whole pages and 2 tokens
        m = c.match(tokens)
        assert isinstance(m.device_indices, np.ndarray) and m.device_indices.dtype == np.int64
        assert len(m.device_indices) == 0 and m.device_tokens == 0 and m.host_tokens == 0
        locs = np.concatenate([locs_of([5, 2, 7]), [-1, -1]])  # the tail is not read
        res = c.insert_locs(tokens, locs)
        assert res.pages == 3 and isinstance(res.freed, np.ndarray) and len(res.freed) == 0
        m = c.match(tokens)
        assert m.device_tokens == 3 * PT and m.l1_slots == [5, 2, 7]
        assert m.device_indices.tolist() == locs[:3 * PT].tolist()
        # The same pages under other locations: all of them come back, as locations.
        res = c.insert_locs(list(tokens), locs_of([0, 1, 3]))
        assert sorted(res.freed.tolist()) == sorted(locs_of([0, 1, 3]).tolist())
        # An int64 token array and a list give the same hit.
        assert c.match(tokens.astype(np.int64)).device_indices.tolist() == m.device_indices.tolist()
        assert c.match(tokens.tolist()).device_tokens == 3 * PT


def test_bad_locations_are_named_before_any_change(tmp_path):
    with one_rank(tmp_path) as c:
        tokens = np.arange(2 * PT, dtype=np.int32)
        bad = locs_of([1, 2])
        bad[PT] = 9  # page 1 starts off a page boundary
        with pytest.raises(cpcache.InvalidError, match=rf"locs\[{PT}\] = 9 does not start a page"):
            c.insert_locs(tokens, bad)
        gap = locs_of([1, 2])
        gap[PT + 2] = 100
        with pytest.raises(cpcache.InvalidError, match=rf"locs\[{PT + 2}\] = 100: .*contiguous, want {2 * PT + 2}"):
            c.insert_locs(tokens, gap)
        with pytest.raises(cpcache.InvalidError, match="4 locs for the 8 tokens"):
            c.insert_locs(tokens, locs_of([1]))
        with pytest.raises(cpcache.InvalidError, match=r"slot 8 .*outside the L1 pool"):
            c.insert_locs(tokens, locs_of([1, L1_PAGES]))
        with pytest.raises(cpcache.InvalidError, match="token 1 .*not an int32"):
            c.match(np.array([1, 2**40], dtype=np.int64))
        assert c.stats()["l1_used"] == 0


def test_torch_in_torch_out(tmp_path):
    torch = pytest.importorskip("torch", reason="torch (Debian python3-torch) is not installed")
    with one_rank(tmp_path) as c:
        tokens = torch.arange(7, 7 + 2 * PT, dtype=torch.int64)
        res = c.insert_locs(tokens, torch.tensor(locs_of([3, 4])))
        assert torch.is_tensor(res.freed) and res.freed.dtype == torch.int64
        m = c.match(tokens)
        assert torch.is_tensor(m.device_indices) and m.device_indices.dtype == torch.int64
        assert m.device_indices.tolist() == locs_of([3, 4]).tolist()
        assert isinstance(c.match(tokens, out="numpy").device_indices, np.ndarray)
        assert torch.is_tensor(c.match(tokens.numpy(), out="torch").device_indices)
        with pytest.raises(cpcache.InvalidError, match="out 'jax'"):
            c.match(tokens, out="jax")


def test_evict_load_back_and_take_freed_in_locations(tmp_path):
    with one_rank(tmp_path) as c:
        tokens = np.arange(500, 500 + 3 * PT, dtype=np.int32)
        c.insert_locs(tokens, locs_of([0, 1, 2]))
        while c.pending():
            c.step()
        assert len(c.take_freed_locs()) == 0
        ev = c.evict_locs(2 * PT + 1)  # at least 9 tokens: 3 pages
        assert ev.freed_tokens == 3 * PT and ev.pending_tokens == 0
        assert sorted(ev.freed.tolist()) == locs_of([0, 1, 2]).tolist()
        m = c.match(tokens)
        assert m.device_tokens == 0 and m.host_tokens == 3 * PT
        c.lock(m.node)
        want = c.load_back_tokens(m.node)
        assert want == 3 * PT
        with pytest.raises(cpcache.InvalidError, match="not whole pages"):
            c.load_back_locs(m.node, locs_of([4, 5])[:-1])
        loaded = c.load_back_locs(m.node, locs_of([4, 5, 6]))
        assert loaded.pages == 3 and loaded.tokens == 3 * PT and len(loaded.freed) == 0
        while c.load_pending(m.node):
            c.step()
        assert c.match(tokens).device_indices.tolist() == locs_of([4, 5, 6]).tolist()
        c.unlock(m.node)
        c.flush()
        assert sorted(c.take_freed_locs().tolist()) == locs_of([4, 5, 6]).tolist()


def test_make_room_is_one_call(tmp_path):
    with one_rank(tmp_path) as c:
        a = np.arange(0, 6 * PT, dtype=np.int32)
        c.insert_locs(a, locs_of(range(6)))
        while c.pending():
            c.step()
        # Room for a 4-page request beside 6 cached pages of 8: 2 pages go, LRU first.
        made = c.make_room(4 * PT)
        assert made.room and len(made.freed) == 2 * PT and c.l1_used_by(0) == 4
        # The engine holds 3 pages outside the cache: one more goes.
        made = c.make_room(4 * PT + 1, start=3 * PT, reserved=[3])  # pages 3 and 4
        assert made.room and len(made.freed) == PT and c.l1_used_by(0) == 3
        m = c.match(a)
        c.lock(m.node)  # locked pages cannot go: no room
        made = c.make_room(L1_PAGES * PT)
        assert not made.room and len(made.freed) == 0
        c.unlock(m.node)
        with pytest.raises(cpcache.InvalidError, match="reserved has 2 entries, want cp_size 1"):
            c.make_room(PT, reserved=[0, 0])
        with pytest.raises(cpcache.InvalidError, match="end 1 is not in"):
            c.make_room(1, start=2)
