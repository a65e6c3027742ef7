"""One rank of a fake SGLang scheduler driving cpcache.sglang.HiCache (run under `cpcache
launch`; python/tests/test_sglang.py). SGLang-like Req / ReqToTokenPool / paged allocator
objects; the scheduler loop makes SGLang's calls in SGLang's order (match_prefix, lock,
init_load_back, make_room, alloc, ready_to_load_host_cache, the forward with per-layer waits,
cache_unfinished_req, decode steps with check_hicache_events, cache_finished_req) over
multi-turn conversations, with little L1 so that pages are evicted and loaded back. Each
token's "KV" is an int64 per layer, a function of its prefix: every hit is checked. Prints
one line of counters; exits 1 on a bad KV value or a location not handed back exactly once."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np  # noqa: E402

import cpcache  # noqa: E402
import cpcache.sglang  # noqa: E402

PT, LAYERS = 4, 2
SPEC = f"layers={LAYERS};k=8:sharded"  # one int64 a token and layer


class Req:
    """The fields of SGLang's Req the class reads."""

    def __init__(self, rid, prompt, answer, extra_key=None):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []
        self.answer = list(answer)
        self.fill_ids = list(prompt)
        self.req_pool_idx = None
        self.prefix_indices = None
        self.last_node = None
        self.extra_key = extra_key


class RadixKey:
    def __init__(self, token_ids, extra_key=None):
        self.token_ids, self.extra_key = token_ids, extra_key


class ReqToTokenPool:
    def __init__(self, size, max_len, torch):
        self.torch = torch
        self.req_to_token = (torch.full((size, max_len), -1, dtype=torch.int64) if torch
                             else np.full((size, max_len), -1, dtype=np.int64))
        self.free_slots = list(range(size))

    def alloc(self):
        return self.free_slots.pop()

    def free(self, idx):
        self.req_to_token[idx] = -1
        self.free_slots.append(idx)


class PagedAllocator:
    """SGLang's paged token_to_kv_pool_allocator: alloc(n) gives n/page whole pages'
    locations; free(locations) gives back the pages they are in (a request's partial last
    page is freed by the locations it used). A page must come back exactly once: one freed
    while not out (twice, or never given) is counted in bad."""

    def __init__(self, pages):
        self.free_pages = list(range(pages - 1, -1, -1))
        self.out = set()  # pages
        self.bad = 0

    def available_size(self):
        return len(self.free_pages) * PT

    def alloc(self, n):
        assert n % PT == 0, n
        if n // PT > len(self.free_pages):
            return None
        pages = [self.free_pages.pop() for _ in range(n // PT)]
        self.out.update(pages)
        return np.array([p * PT + k for p in pages for k in range(PT)], dtype=np.int64)

    def free(self, locs):
        locs = locs.tolist() if hasattr(locs, "tolist") else list(locs)
        for p in sorted({loc // PT for loc in locs}):
            if p not in self.out:
                self.bad += 1
                continue
            self.out.remove(p)
            self.free_pages.append(p)


def kv_values(tokens, layer):
    """The KV of every token of tokens at layer: a hash of its prefix."""
    out, h = [], 7 + layer
    for t in tokens:
        h = (h * 1000003 + int(t) + 1) % (1 << 61)
        out.append(h)
    return out


def conversation(client, rnd, with_answer):
    toks = []
    for r in range(rnd + 1):
        toks += [(client * 7919 + r * 131 + t * 17) % 32000 for t in range(22)]
        if r < rnd or with_answer:
            toks += [(client * 104729 + r * 151 + t * 13 + 5) % 32000 for t in range(9)]
    return toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn-cp", type=int, default=1)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--l1-pages", type=int, default=40)
    ap.add_argument("--tensors", choices=["numpy", "torch"], default="numpy")
    a = ap.parse_args()
    torch = None
    if a.tensors == "torch":
        import torch
    kv = {layer: np.zeros((a.l1_pages * PT, 1), dtype=np.int64) for layer in range(LAYERS)}
    bufs = [cpcache.token_slot_buffer(layer, 0, arr, PT) for layer, arr in kv.items()]
    cache = cpcache.Cache(attn_cp=a.attn_cp, page_tokens=PT, l1_pages=a.l1_pages, l2_pages=512, kv_layout=SPEC,
                          l1_buffers=bufs, l1_mode="engine_owned")
    info = cache.info
    cp, me = info.cp_size, info.cp_rank
    alloc = PagedAllocator(a.l1_pages)
    pool = ReqToTokenPool(4, 1024, torch)
    running = []

    def reserved():
        # Pages each CP rank holds outside the cache for the running requests: those past
        # their prefix (the same on every rank: lengths only).
        out = [0] * cp
        for r in running:
            lo, hi = len(r.prefix_indices) // PT, -(-r.allocated // PT)
            for p in range(lo, hi):
                out[p % cp] += 1
        return out

    tree = cpcache.sglang.HiCache(cache, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=PT,
                                  reserved=reserved)
    c = dict(requests=0, hit_device=0, hit_host=0, checked=0, bad_kv=0, steps=0)

    def check(tokens, locs, upto):
        want = {layer: kv_values(tokens[:upto], layer) for layer in range(LAYERS)}
        locs = locs.tolist() if hasattr(locs, "tolist") else list(locs)
        for i in range(upto):
            if (i // PT) % cp != me:
                if locs[i] != -1:
                    c["bad_kv"] += 1  # another rank's token must be -1 here
                continue
            c["checked"] += 1
            for layer in range(LAYERS):
                if kv[layer][locs[i], 0] != want[layer][i]:
                    c["bad_kv"] += 1

    def step():
        tree.check_hicache_events()
        c["steps"] += 1

    try:
        for rnd in range(a.rounds):
            for client in range(a.clients):
                prompt = conversation(client, rnd, False)
                answer = conversation(client, rnd, True)[len(prompt):]
                req = Req(f"{client}-{rnd}", prompt, answer, extra_key="tenant-a" if client % 2 else None)
                req.req_pool_idx = pool.alloc()
                m = tree.match_prefix(RadixKey(prompt, req.extra_key))
                req.prefix_indices, req.last_node = m.device_indices, m.last_device_node
                tree.inc_lock_ref(req.last_node)
                c["hit_device"] += len(m.device_indices)
                if m.host_hit_length > 0:
                    loaded, node = tree.init_load_back(m.last_host_node, m.host_hit_length)
                    if len(loaded):
                        c["hit_host"] += len(loaded)
                        cat = torch.cat if torch else np.concatenate
                        req.prefix_indices = cat([req.prefix_indices, loaded])
                # Locations for the rest of the sequence (prompt and answer but its last token):
                # this rank's pages only, after the agreed eviction.
                total = len(prompt) + len(answer) - 1
                start = len(req.prefix_indices)
                req.allocated = total
                while not tree.make_room(total, start):
                    step()  # backups in flight: their pages go once committed
                row = pool.req_to_token[req.req_pool_idx]
                row[:start] = req.prefix_indices
                for p in range(start // PT, -(-total // PT)):
                    if p % cp == me:
                        got = alloc.alloc(PT)
                        assert got is not None, f"make_room said there was room: used {cache.l1_used_by(me)} free {len(alloc.free_pages)} out {len(alloc.out)} start {start} total {total} reserved {reserved()} req {c}"
                        row[p * PT:p * PT + PT] = torch.from_numpy(got) if torch else got
                running.append(req)
                tree.ready_to_load_host_cache()
                for layer in range(LAYERS):  # the forward: each layer waits for its loads
                    tree.wait_layer(layer)
                check(prompt, row, start)
                seq = prompt + answer[:-1]
                rowl = row.tolist() if hasattr(row, "tolist") else list(row)
                for layer in range(LAYERS):
                    vals = kv_values(seq, layer)
                    for i in range(start, total):
                        if rowl[i] >= 0:
                            kv[layer][rowl[i], 0] = vals[i]
                tree.cache_unfinished_req(req, chunked=True)
                check(prompt, req.prefix_indices, len(prompt) // PT * PT)
                for t in answer:  # decode
                    req.output_ids.append(t)
                    step()
                tree.cache_finished_req(req)
                running.remove(req)
                pool.free(req.req_pool_idx)
                c["requests"] += 1
        while cache.pending():
            step()
        assert tree.protected_size() == 0, tree.protected_size()
        tree.reset()
        print(f"rank {info.rank} cp {me}/{cp}: " + " ".join(f"{k}={v}" for k, v in c.items())
              + f" locations_out={len(alloc.out)} bad_frees={alloc.bad}", flush=True)
        return 1 if c["bad_kv"] or alloc.out or alloc.bad else 0
    finally:
        cache.close()


if __name__ == "__main__":
    sys.exit(main())
