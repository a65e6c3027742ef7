#!/usr/bin/env python3
"""The binding's cost per scheduler step, as an engine sees it: a batch of REQS running
requests with PROMPT-token prompts, each growing by one page a step; every step matches each
request (Cache.match: device_indices as an int64 array), inserts it with its per-token
locations (Cache.insert_locs) and steps (Cache.step). The same work runs through the Go API
in the same process and on the same cache (cpcache_bench_step_go, in a library built with
-tags cpcache_bench: `make bench-python`), rounds alternating; each side's best round of each
part (match, insert, step) counts.
Prints ns per step for both and `ratio python_step_vs_go X` (Python / Go).

Also with --sglang: the same steps through cpcache.sglang.HiCache (match_prefix,
cache_unfinished_req, check_hicache_events), reported as ratio sglang_step_vs_go."""
import argparse
import ctypes
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import cpcache  # noqa: E402
import cpcache.sglang  # noqa: E402

PT = 16


class Workload:
    """Request r's tokens (first token 1000000+round*1000+r, then k) and locations (page i
    in slot r*per_req+i), as cpcache_bench_step_go builds them."""

    def __init__(self, reqs, prompt, steps):
        self.reqs, self.prompt, self.steps = reqs, prompt, steps
        self.per_req = prompt // PT + steps
        n = self.per_req * PT
        self.base = np.arange(n, dtype=np.int32)
        self.locs = [np.arange(r * n, (r + 1) * n, dtype=np.int64) for r in range(reqs)]

    def tokens(self, rnd):
        out = []
        for r in range(self.reqs):
            t = self.base.copy()
            t[0] = 1000000 + rnd * 1000 + r
            out.append(t)
        return out


def clean(cache):
    """Untimed: every page leaves L1 and L2 (as the Go side does)."""
    while cache.pending():
        cache.step()
    cache.evict_locs(1 << 40)
    cache.evict_l2(1 << 30)
    cache.take_freed_locs()


def python_round(cache, w, rnd):
    toks = w.tokens(rnd)
    t_match = t_ins = t_step = 0
    clock = time.perf_counter_ns
    for st in range(w.steps):
        n = w.prompt + st * PT
        for r in range(w.reqs):
            tok, loc = toks[r][:n], w.locs[r][:n]
            t0 = clock()
            cache.match(tok)
            t1 = clock()
            cache.insert_locs(tok, loc)
            t2 = clock()
            t_match += t1 - t0
            t_ins += t2 - t1
        t0 = clock()
        cache.step()
        t_step += clock() - t0
    clean(cache)
    return t_match, t_ins, t_step


class _Req:
    def __init__(self, tokens, idx):
        self.origin_input_ids, self.output_ids, self.fill_ids = tokens, [], tokens
        self.req_pool_idx, self.prefix_indices, self.last_node, self.extra_key = idx, np.empty(0, np.int64), 0, None


class _Params:  # SGLang's MatchPrefixParams
    def __init__(self, key, req):
        self.key, self.req = key, req


class _Pool:
    def __init__(self, w):
        self.req_to_token = np.stack(w.locs)


class _NoAlloc:
    def free(self, locs):
        pass


def sglang_round(cache, w, rnd, lists=False):
    """The same steps through HiCache: match_prefix, cache_unfinished_req (insert with the
    row kept, the lock), check_hicache_events. Timed as one (match = the whole request).
    lists: the requests hold Python lists of token ids, as SGLang's Req does (the prompt
    is converted once, on the request)."""
    toks = w.tokens(rnd)
    tree = cpcache.sglang.HiCache(cache, req_to_token_pool=_Pool(w), token_to_kv_pool_allocator=_NoAlloc(),
                                  page_size=PT, tensors="numpy")
    reqs = [_Req(toks[r].tolist() if lists else toks[r], r) for r in range(w.reqs)]
    t_req = t_step = 0
    clock = time.perf_counter_ns
    for st in range(w.steps):
        n = w.prompt + st * PT
        for req in reqs:
            req.fill_ids = req.origin_input_ids[:n]
            t0 = clock()
            tree.match_prefix(_Params(req.fill_ids, req))
            tree.cache_unfinished_req(req)
            t_req += clock() - t0
        t0 = clock()
        tree.check_hicache_events()
        t_step += clock() - t0
    for req in reqs:
        tree.dec_lock_ref(req.last_node)
    clean(cache)
    return t_req, 0, t_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reqs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--sglang", action="store_true", help="also time the steps through cpcache.sglang.HiCache")
    ap.add_argument("--lists", action="store_true", help="--sglang with token ids in Python lists, as SGLang's Req")
    a = ap.parse_args()
    lib = cpcache.library()
    if not hasattr(lib, "cpcache_bench_step_go"):
        sys.exit(f"{lib._name} has no cpcache_bench_step_go: build it with -tags cpcache_bench (make bench-python)")
    go = lib.cpcache_bench_step_go
    go.argtypes = [ctypes.c_uint64] + [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_double)]
    w = Workload(a.reqs, a.prompt, a.steps)
    pages = a.reqs * w.per_req
    with tempfile.TemporaryDirectory(prefix="cpcache-bench-step-") as d, \
            cpcache.Cache(world=1, rank=0, store=f"file://{d}", page_tokens=PT, page_bytes=64, l1_pages=pages,
                          l2_pages=2 * pages, l1_mode="engine_owned") as cache:
        sides = {"go": [], "python": []}
        if a.sglang:
            sides["sglang"] = []
        rnd = 0
        for i in range(a.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(list(sides)))
            for side in order:
                if side == "go":
                    out = (ctypes.c_double * 3)()
                    cpcache._check(go(cache._h, rnd, a.reqs, a.prompt, a.steps, out))
                    r = tuple(out)
                elif side == "python":
                    r = python_round(cache, w, rnd)
                else:
                    r = sglang_round(cache, w, rnd, a.lists)
                rnd += 1
                if i > 0:  # round 0 warms up
                    sides[side].append(r)
        # Each part's best round (as bench.c): a shared machine's noise lands in some rounds.
        best = {s: tuple(min(r[k] for r in rs) for k in range(3)) for s, rs in sides.items()}
        print(f"{a.reqs} requests × {a.prompt}-token prompts (+1 page a step), {a.steps} steps a round, "
              f"best of {a.rounds - 1} rounds per part; ns per scheduler step:")
        print(f"{'':8} {'match':>12} {'insert':>12} {'step':>12} {'total':>12}")
        for s, (m, ins, st) in best.items():
            print(f"{s:8} {m / a.steps:12.0f} {ins / a.steps:12.0f} {st / a.steps:12.0f} {(m + ins + st) / a.steps:12.0f}")
        g = sum(best["go"])
        print(f"ratio python_step_vs_go {sum(best['python']) / g:.2f}")
        if a.sglang:
            print(f"ratio sglang_step_vs_go {sum(best['sglang']) / g:.2f}")


if __name__ == "__main__":
    main()
