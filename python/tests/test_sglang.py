"""cpcache.sglang.HiCache: SGLang's prefix-cache calls over cpcache. A fake SGLang scheduler
(sglang_rank.py: Req, ReqToTokenPool, a paged allocator) at CP 1 and 2 under `cpcache
launch`, and the lock / evict / load-back semantics on one rank."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpcache  # noqa: E402

np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
import cpcache.sglang  # noqa: E402
import sglang_rank as fake  # noqa: E402

PT = fake.PT


def binary():
    b = os.environ.get("CPCACHE_BIN") or os.path.join(ROOT, "bin", "cpcache")
    if not os.access(b, os.X_OK):
        b = shutil.which("cpcache") or b
    return b


@pytest.mark.parametrize("cp,tensors", [(1, "numpy"), (2, "numpy"), (2, "torch")])
def test_fake_scheduler_under_launch(cp, tensors):
    """Multi-turn conversations through SGLang's calls on every CP rank: device and host
    (loaded back) hits, every hit's KV checked at its locations, other ranks' tokens -1, and
    after reset every page back in the allocator exactly once."""
    if tensors == "torch":
        pytest.importorskip("torch", reason="torch (Debian python3-torch) is not installed")
    cmd = [binary(), "launch", "-n", str(cp), "--", sys.executable, os.path.join(os.path.dirname(__file__), "sglang_rank.py"),
           "--attn-cp", str(cp), "--tensors", tensors]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [line for line in out.stdout.splitlines() if "requests=" in line]
    assert len(reports) == cp, out.stdout
    for line in reports:
        kv = dict(re.findall(r"(\w+)=(\d+)", line))
        assert kv["bad_kv"] == "0" and kv["locations_out"] == "0" and kv["bad_frees"] == "0", line
        assert int(kv["hit_device"]) > 0 and int(kv["hit_host"]) > 0 and int(kv["checked"]) > 0, line
        assert kv["requests"] == "18", line


class Pool:
    def __init__(self):
        self.req_to_token = np.full((2, 64), -1, dtype=np.int64)


@pytest.fixture
def tree(tmp_path):
    cache = cpcache.Cache(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PT, page_bytes=64, l1_pages=8,
                          l2_pages=32, l1_mode="engine_owned")
    alloc = fake.PagedAllocator(8)
    t = cpcache.sglang.HiCache(cache, req_to_token_pool=Pool(), token_to_kv_pool_allocator=alloc, page_size=PT)
    t.alloc = alloc
    try:
        yield t
    finally:
        cache.close()


def admit(tree, tokens, pool_idx=0):
    """A request's prefill as SGLang's scheduler makes it: match, lock, locations for the
    rest, cache_unfinished_req. Returns the request."""
    req = fake.Req("r", tokens, [1])
    req.req_pool_idx = pool_idx
    m = tree.match_prefix(key=fake.RadixKey(tokens))
    req.prefix_indices, req.last_node = m.device_indices, m.last_device_node
    tree.inc_lock_ref(req.last_node)
    row = tree.req_to_token_pool.req_to_token[pool_idx]
    row[:len(m.device_indices)] = m.device_indices
    new = tree.alloc.alloc(len(tokens) - len(m.device_indices))
    row[len(m.device_indices):len(tokens)] = new
    tree.cache_unfinished_req(req)
    return req


def test_page_size_must_be_page_tokens(tmp_path):
    with cpcache.Cache(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PT, page_bytes=64, l1_pages=8,
                       l2_pages=8, l1_mode="engine_owned") as c:
        with pytest.raises(ValueError, match="page_size 1 is not the cache's page_tokens 4"):
            cpcache.sglang.HiCache(c, page_size=1)


def test_lock_protects_from_evict_and_sizes_follow(tree):
    tokens = list(range(10, 10 + 3 * PT))
    req = admit(tree, tokens)
    assert req.last_node and len(req.prefix_indices) == 3 * PT
    assert tree.total_size() == 3 * PT and tree.protected_size() == 3 * PT and tree.evictable_size() == 0
    while tree.cache.pending():
        tree.check_hicache_events()
    assert tree.evict(3 * PT).num_tokens_evicted == 0  # locked: nothing goes
    assert tree.match_prefix(tokens).device_indices.tolist() == req.prefix_indices.tolist()
    tree.dec_lock_ref(req.last_node)
    assert tree.protected_size() == 0 and tree.evictable_size() == 3 * PT
    assert tree.evict(PT + 1).num_tokens_evicted == 2 * PT  # at least PT + 1 tokens: 2 pages
    m = tree.match_prefix(tokens)
    assert len(m.device_indices) == PT and m.host_hit_length == 2 * PT
    tree.reset()
    assert not tree.alloc.out and tree.alloc.bad == 0


def test_finished_request_frees_what_the_cache_does_not_keep(tree):
    tokens = list(range(50, 50 + 2 * PT))
    req = fake.Req("a", tokens, [7, 8, 9])  # committed: 2 pages + 2 tokens of a third page
    req.req_pool_idx, req.output_ids = 0, [7, 8, 9]
    req.prefix_indices, req.last_node = np.empty(0, dtype=np.int64), 0
    row = tree.req_to_token_pool.req_to_token[0]
    row[:3 * PT] = tree.alloc.alloc(3 * PT)
    tree.cache_finished_req(req)
    assert tree.total_size() == 2 * PT and len(tree.alloc.out) == 2  # the partial page came back
    # The same tokens again under other locations: the duplicates come back.
    req2 = fake.Req("b", tokens, [7, 8, 9])
    req2.req_pool_idx, req2.output_ids = 1, [7, 8, 9]
    req2.prefix_indices, req2.last_node = np.empty(0, dtype=np.int64), 0
    row2 = tree.req_to_token_pool.req_to_token[1]
    row2[:3 * PT] = tree.alloc.alloc(3 * PT)
    tree.cache_finished_req(req2)
    assert len(tree.alloc.out) == 2 and tree.alloc.bad == 0
    tree.reset()
    assert not tree.alloc.out and tree.alloc.bad == 0


def test_init_load_back_into_allocator_locations(tree):
    tokens = list(range(200, 200 + 3 * PT))
    req = admit(tree, tokens)
    tree.dec_lock_ref(req.last_node)
    while tree.cache.pending():
        tree.check_hicache_events()
    tree.evict(3 * PT)
    m = tree.match_prefix(key=fake.RadixKey(tokens))
    assert len(m.device_indices) == 0 and m.host_hit_length == 3 * PT and m.best_match_node == m.last_host_node
    tree.inc_lock_ref(m.last_device_node)
    assert len(tree.init_load_back(m.last_host_node, m.host_hit_length, mem_quota=PT)[0]) == 0  # over the quota
    locs, node = tree.init_load_back(m.last_host_node, m.host_hit_length)
    assert node == m.last_host_node and len(locs) == 3 * PT
    assert all(int(x) // PT in tree.alloc.out for x in locs)
    tree.ready_to_load_host_cache()
    tree.wait_layer(0)
    while tree.loading_check():
        tree.check_hicache_events()
    assert tree.match_prefix(tokens).device_indices.tolist() == locs.tolist()
    tree.dec_lock_ref(m.last_device_node)
    assert tree.protected_size() == 0
    tree.reset()
    assert not tree.alloc.out and tree.alloc.bad == 0
