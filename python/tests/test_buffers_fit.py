"""Issue 38, point 3: the engine's L1 arrays are checked against the KV layout. Each buffer's
row (its non-token dimensions × element size) must be its part's bytes per token on this
rank, or the open is refused naming both (a padded row is declared with padded=True); K and
V interleaved per token in disjoint columns of one array share no byte and are accepted;
l1_pages is taken from the buffers when not given."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")

PAGE_TOKENS, SLOTS = 4, 8


def one_rank(tmp_path, **kw):
    args = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PAGE_TOKENS, l1_pages=SLOTS, l2_pages=16)
    args.update(kw)
    return cpcache.Cache(**args)


def _round_trip(c, arrays):
    """Inserts two pages, fills every (layer, part) row with a value of its own, evicts them
    to L2, zeroes the arrays, loads them back and returns the rows of the first loaded token
    of each (layer, part)."""
    tokens = list(range(100, 100 + 2 * PAGE_TOKENS))
    res = c.insert(tokens)
    for p in res.fill:
        for (l, j), a in arrays.items():
            for t in range(PAGE_TOKENS):
                a[p.slot * PAGE_TOKENS + t] = np.full(a[0].shape, 1 + p.index * 16 + l * 4 + j, dtype=a.dtype)
    while c.pending():
        c.step()
    for a in arrays.values():
        a[:] = 0
    assert c.evict_l1(2).freed == 2
    m = c.match(tokens)
    c.lock(m.node)
    assert c.load_back(m.node) == 2
    while c.load_pending(m.node):
        c.step()
    m = c.match(tokens)
    c.wait_l1(m.node)
    out = {}
    for i, slot in enumerate(m.l1_slots):
        for (l, j), a in arrays.items():
            out[(i, l, j)] = [a[slot * PAGE_TOKENS + t].copy() for t in range(PAGE_TOKENS)]
    c.unlock(m.node)
    return out


def test_rows_wider_than_the_part_are_refused_naming_both(tmp_path):
    """A layout of k=32 bytes a token over float16 arrays of 2 heads × 16 (64-byte rows):
    the cache would copy the first 32 bytes of each row (heads 0-1 come back, the rest are
    zeros). The open is refused naming the buffer, its layer and part, and both sizes."""
    spec = "layers=1;k=32:sharded;v=32:sharded"
    arrays = [np.zeros((SLOTS * PAGE_TOKENS, 2, 16), dtype=np.float16) for _ in range(2)]
    with pytest.raises(cpcache.InvalidError) as e:
        one_rank(tmp_path, kv_layout=spec, l1_buffers=[(0, j, a) for j, a in enumerate(arrays)])
    msg = str(e.value)
    assert "l1_buffers[0]" in msg and "layer 0" in msg and "part 0" in msg, msg
    assert "64 bytes a token" in msg and "32" in msg, msg
    # Declared padding opens: the part takes the first 32 bytes of each 64-byte row.
    bufs = [cpcache.token_slot_buffer(0, j, a, PAGE_TOKENS, padded=True) for j, a in enumerate(arrays)]
    with one_rank(tmp_path, kv_layout=spec, l1_buffers=bufs) as c:
        assert c.kv_bytes_per_token() == 64


def test_block_major_rows_are_checked_too(tmp_path):
    layers = [np.zeros((SLOTS, 2, PAGE_TOKENS, 4, 8), dtype=np.uint8) for _ in range(2)]  # 32-byte rows
    bufs = [b for l, t in enumerate(layers) for b in cpcache.block_major_buffers(l, t)]
    with pytest.raises(cpcache.InvalidError, match=r"l1_buffers\[0\]: layer 0 part 0.*32 bytes a token.*16"):
        one_rank(tmp_path, kv_layout="layers=2;k=16:sharded;v=16:sharded", l1_buffers=bufs)
    with one_rank(tmp_path, kv_layout="layers=2;k=32:sharded;v=32:sharded", l1_buffers=bufs) as c:
        assert c.kv_page_bytes() == 2 * 2 * 32 * PAGE_TOKENS


def test_rows_are_the_parts_bytes_on_this_attention_tp_rank(tmp_path):
    """A sharded part's bytes per token are divided over attention-TP ranks: arrays holding
    all heads (the whole part) on one of 2 attention-TP ranks are refused, naming the rank's
    size. Under world=2 the check runs before any rank talks to another, so one rank shows it."""
    spec = "layers=1;k=32:sharded;v=32:sharded"  # 16 bytes a token on each of 2 TP ranks
    arrays = [np.zeros((SLOTS * PAGE_TOKENS, 32), dtype=np.uint8) for _ in range(2)]
    with pytest.raises(cpcache.InvalidError, match=r"rows are 32 bytes a token, the part's bytes per token on this rank are 16"):
        cpcache.Cache(world=2, tp=2, rank=0, store=f"file://{tmp_path}", page_tokens=PAGE_TOKENS, l2_pages=16,
                      kv_layout=spec, l1_buffers=[(0, j, a) for j, a in enumerate(arrays)], timeout_ms=2000)


def test_interleaved_k_and_v_columns_are_accepted_and_load_back(tmp_path):
    """K and V interleaved per token: columns [0, 16) and [16, 32) of one [tokens, 32] array
    per layer share no byte. They open, and every byte loads back into its own columns."""
    spec = "layers=2;k=16:sharded;v=16:sharded"
    whole = [np.zeros((SLOTS * PAGE_TOKENS, 32), dtype=np.uint8) for _ in range(2)]
    arrays = {(l, j): whole[l][:, 16 * j:16 * (j + 1)] for l in range(2) for j in range(2)}
    bufs = [(l, j, a) for (l, j), a in arrays.items()]
    with one_rank(tmp_path, kv_layout=spec, l1_buffers=bufs, write_threshold=1) as c:
        got = _round_trip(c, arrays)
    for (i, l, j), rows in got.items():
        for row in rows:
            assert (row == 1 + i * 16 + l * 4 + j).all(), (i, l, j, row)
    # Columns that do share a byte stay refused.
    arrays = {(l, j): whole[l][:, 15 * j:15 * j + 16] if j else whole[l][:, :16] for l in range(2) for j in range(2)}
    with pytest.raises(cpcache.InvalidError, match="overlaps"):
        one_rank(tmp_path, kv_layout=spec, l1_buffers=[(l, j, a) for (l, j), a in arrays.items()])


def test_l1_pages_is_taken_from_the_buffers(tmp_path):
    spec = "layers=1;k=16:sharded;v=16:sharded"
    arrays = [np.zeros((n * PAGE_TOKENS, 16), dtype=np.uint8) for n in (12, 10)]
    kw = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PAGE_TOKENS, l2_pages=16, kv_layout=spec)
    with cpcache.Cache(l1_buffers=[(0, j, a) for j, a in enumerate(arrays)], **kw) as c:
        assert c.info.l1_pages == 10
    layer = np.zeros((6, 2, PAGE_TOKENS, 16), dtype=np.uint8)
    with cpcache.Cache(l1_buffers=cpcache.block_major_buffers(0, layer), **kw) as c:
        assert c.info.l1_pages == 6
    with pytest.raises(cpcache.InvalidError, match="l1_pages is required"):
        cpcache.Cache(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PAGE_TOKENS, page_bytes=64, l2_pages=16)


def test_torch_half_rows_wider_than_the_part_are_refused(tmp_path):
    torch = pytest.importorskip("torch", reason="torch (Debian python3-torch) is not installed")
    arrays = [torch.zeros((SLOTS * PAGE_TOKENS, 2, 16), dtype=torch.float16) for _ in range(2)]
    with pytest.raises(cpcache.InvalidError, match="64 bytes a token"):
        one_rank(tmp_path, kv_layout="layers=1;k=32:sharded;v=32:sharded",
                 l1_buffers=[(0, j, a) for j, a in enumerate(arrays)])
    with one_rank(tmp_path, kv_layout="layers=1;k=64:sharded;v=64:sharded",
                  l1_buffers=[(0, j, a) for j, a in enumerate(arrays)]) as c:
        assert c.kv_bytes_per_token() == 128
