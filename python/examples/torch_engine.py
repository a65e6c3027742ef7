#!/usr/bin/env python3
"""A torch engine over cpcache: the reference transformer in torch processes over CP ranks.

The model is the reference transformer of sim/refmodel and python/examples/refmodel.py
(Llama-style: RMSNorm, RoPE, grouped-query attention, SwiGLU; float32, d=64, 4 layers,
vocabulary 512, 4 query heads over 2 KV heads of 16; weights from numpy's seeded Generator,
seed 1), computed with torch on the CPU in --world worker processes started with
multiprocessing's spawn method. Ranks are grouped into context-parallel (CP) groups of
--attn-cp ranks (world / attn-cp data-parallel replicas, each serving its share of the
conversations). Every rank of a CP group computes every token's hidden state, but holds the
K/V of only its own pages (page i of a sequence is CP rank i mod attn-cp's) and computes
attention over them alone; the partial outputs, maxima and sums are all-gathered over
torch.distributed (gloo) and merged with the log-sum-exp rule, in rank order, on every rank.

The per-layer K/V are torch tensors ([l1_pages × PAGE_TOKENS, KV_HEADS, HEAD_DIM], SGLang's
token-slot layout) lent to the cache as its L1 (l1_buffers) in engine-owned mode: the engine's
allocator gives every slot, the model writes the K/V there, inserts adopt them, and loads from
L2 land in slots the allocator gives. torch.distributed and cpcache both meet at the parent's
TCPStore (the engine's dist_init_method).

The scheduler loop drives cpcache.sglang.HiCache (SGLang's HiRadixCache interface) as SGLang's
scheduler does, one request at a time: match_prefix → inc_lock_ref → (with --storage: a
prefetch, waited for in steps, then match again) → init_load_back → ready_to_load_host_cache
(the step that starts the copies) → the forward, calling wait_layer(l) before layer l reads
the loaded K/V → cache_unfinished_req → decode steps (check_hicache_events every step) →
cache_finished_req. Room for a request's pages is made by the agreed cross-rank eviction
(make_room) before its locations are allocated. Conversations are multi-turn: each turn's
prompt is the conversation so far (earlier prompts and answers) plus new user tokens.
The allocator fills every page it hands out with NaN, as a reused pool page holds another
sequence's K/V: a read before the page is written or loaded shows in the outputs.

Determinism: every token's K/V, attention and logits are computed one token at a time
(matrix-vector products whose shapes depend only on the position and the rank), never in a
batch whose size varies, so a prefix served from the cache gives bit-identical outputs to one
recomputed. Every request is computed again without the cache (the same CP split, scratch
K/V) and compared: the greedy answer tokens and the SHA-256 of the final logits' bytes.

Prints `outputs checked N, differing D` and `hits: L1 a L2 b storage c tokens` (the prompt
tokens served from each tier) and exits 1 when D > 0 (or a rank failed, or a location was
not handed back to the allocator). --kv-events ENDPOINT publishes the cache's KV events in
vLLM's format (Cache(kv_events=...): the first rank of each CP group publishes its replica's),
and --kv-events-replay ENDPOINT answers a router's replay requests.

Run: /usr/bin/python3 python/examples/torch_engine.py --world 4 --attn-cp 2 --requests 12
     [--storage file:///tmp/l3] [--kv-events tcp://*:5557 [--kv-events-replay tcp://*:5558]]
"""
import argparse
import datetime
import hashlib
import math
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback

import numpy as np

# From a checkout, the package beside this example (an installed one may be older); else the
# installed one (make install, or the wheel).
_CHECKOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if os.path.isfile(os.path.join(_CHECKOUT, "cpcache", "sglang.py")):
    sys.path.insert(0, _CHECKOUT)
import cpcache  # noqa: E402
from cpcache.sglang import HiCache  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF = 512, 64, 4, 4, 2, 16, 128
PAGE_TOKENS = 4
KV_SPEC = f"layers={LAYERS};k={KV_HEADS * HEAD_DIM * 4}:sharded;v={KV_HEADS * HEAD_DIM * 4}:sharded"
MODEL_NAME = "cpcache-torch-engine-refmodel-seed1"
BREAKS = ("skip-layer-wait", "neighbour-slot")
POISON = float("nan")  # what a slot holds when the allocator hands it out (until written or loaded)


# --- the model ---------------------------------------------------------------------------

class Model:
    """The reference transformer's weights (refmodel.Model's draw, as torch tensors)."""

    def __init__(self, torch, seed=1):
        rng = np.random.default_rng(seed)

        def mat(out, inp):
            return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

        def norm(n):
            return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

        t = torch.from_numpy
        self.torch = torch
        self.embed = t(rng.standard_normal((VOCAB, DIM)).astype(np.float32))
        self.layers = []
        for _ in range(LAYERS):
            w = dict(attn_norm=norm(DIM), wq=mat(HEADS * HEAD_DIM, DIM), wk=mat(KV_HEADS * HEAD_DIM, DIM),
                     wv=mat(KV_HEADS * HEAD_DIM, DIM), wo=mat(DIM, HEADS * HEAD_DIM), mlp_norm=norm(DIM),
                     wg=mat(FF, DIM), wu=mat(FF, DIM), wd=mat(DIM, FF))
            self.layers.append({k: t(v) for k, v in w.items()})
        self.final_norm = t(norm(DIM))
        self.lm_head = t(mat(VOCAB, DIM))
        for w in self.layers:  # one matrix-vector product for q, k, v and one for gate, up
            w["wqkv"] = torch.cat([w["wq"], w["wk"], w["wv"]]).contiguous()
            w["wgu"] = torch.cat([w["wg"], w["wu"]]).contiguous()
        self.inv_freq = np.power(10000.0, -np.arange(0, HEAD_DIM, 2) / HEAD_DIM)  # float64
        self.scale = float(np.float32(1 / np.sqrt(HEAD_DIM)))
        self._rope_pos = -1
        self._grow_rope(256)

    def _grow_rope(self, n):
        """cos/sin of pos·10000^(-2i/HEAD_DIM) (float64, then float32) for positions < n."""
        theta = np.arange(n)[:, None] * self.inv_freq[None, :]
        self.cos = self.torch.from_numpy(np.cos(theta).astype(np.float32))
        self.sin = self.torch.from_numpy(np.sin(theta).astype(np.float32))
        self._rope_pos = n

    def _rms_norm(self, x, g):
        return x / self.torch.sqrt((x * x).mean() + 1e-6) * g

    def _rope(self, x, pos):
        """Rotates each pair (2i, 2i+1) of every head of x [heads, HEAD_DIM] by pos·10000^(-2i/HEAD_DIM)."""
        if pos >= self._rope_pos:
            self._grow_rope(2 * pos + 1)
        c, s = self.cos[pos], self.sin[pos]
        a, b = x[:, 0::2], x[:, 1::2]
        return self.torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(x.shape)

    def forward(self, tokens, start, kv, cp, before_layer=None):
        """Computes tokens[start:], writing this rank's tokens' K/V of every layer through kv
        (a SeqKV), reading this rank's earlier tokens' from it, with attention merged across
        the CP group (cp: a CPGroup); returns the last token's logits. before_layer(l) runs
        before layer l reads any K/V (the cache's layer-wise wait for a loaded prefix)."""
        torch = self.torch
        n = len(tokens) - start
        xs = [self.embed[t].clone() for t in tokens[start:]]
        group = HEADS // KV_HEADS
        nq, nk = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        for l, w in enumerate(self.layers):
            if before_layer is not None:
                before_layer(l)
            qs = []
            for i, x in enumerate(xs):
                pos = start + i
                qkv = w["wqkv"] @ self._rms_norm(x, w["attn_norm"])
                qk = self._rope(qkv[:nq + nk].reshape(HEADS + KV_HEADS, HEAD_DIM), pos)
                qs.append(qk[:HEADS].reshape(KV_HEADS, group, HEAD_DIM))
                loc = kv.loc(pos)
                if loc >= 0:  # this rank's token: its K/V go to its slot
                    kv.ks[l][loc] = qk[HEADS:]
                    kv.vs[l][loc] = qkv[nq + nk:].reshape(KV_HEADS, HEAD_DIM)
            # Partial attention over this rank's keys at positions <= pos: [n, HEADS, HEAD_DIM + 2]
            # (the unnormalised output, the maximum score, the sum of exponentials).
            part = torch.empty((n, HEADS, HEAD_DIM + 2), dtype=torch.float32)
            for i, q in enumerate(qs):
                rows = kv.own_rows(start + i + 1)
                if rows.numel() == 0:  # none of this rank's tokens yet: exp(-inf - max) = 0
                    part[i, :, :HEAD_DIM] = 0
                    part[i, :, HEAD_DIM] = -math.inf
                    part[i, :, HEAD_DIM + 1] = 0
                    continue
                keys = kv.ks[l].index_select(0, rows).permute(1, 2, 0)  # [KV_HEADS, HEAD_DIM, n]
                vals = kv.vs[l].index_select(0, rows).transpose(0, 1)  # [KV_HEADS, n, HEAD_DIM]
                scores = torch.bmm(q, keys) * self.scale  # [KV_HEADS, group, n]
                m = scores.max(dim=-1, keepdim=True).values
                e = torch.exp(scores - m)
                part[i, :, :HEAD_DIM] = torch.bmm(e, vals).reshape(HEADS, HEAD_DIM)
                part[i, :, HEAD_DIM] = m.reshape(HEADS)
                part[i, :, HEAD_DIM + 1] = e.sum(dim=-1).reshape(HEADS)
            parts = cp.all_gather(part)  # one [n, HEADS, HEAD_DIM + 2] per CP rank, in rank order
            top = torch.stack([p[:, :, HEAD_DIM] for p in parts]).max(dim=0).values  # [n, HEADS]
            num = torch.zeros((n, HEADS, HEAD_DIM), dtype=torch.float32)
            den = torch.zeros((n, HEADS), dtype=torch.float32)
            for p in parts:  # the log-sum-exp merge, in rank order
                f = torch.exp(p[:, :, HEAD_DIM] - top)
                num += f.unsqueeze(-1) * p[:, :, :HEAD_DIM]
                den += f * p[:, :, HEAD_DIM + 1]
            attn = num / den.unsqueeze(-1)
            for i, x in enumerate(xs):
                x += w["wo"] @ attn[i].reshape(-1)
                gu = w["wgu"] @ self._rms_norm(x, w["mlp_norm"])
                g = gu[:FF]
                x += w["wd"] @ ((g / (1 + torch.exp(-g))) * gu[FF:])
        return self.lm_head @ self._rms_norm(xs[-1], self.final_norm)


class CPGroup:
    """This rank's CP group over torch.distributed: its size, this rank's index in it, and
    all_gather of equal-shaped tensors (in CP rank order)."""

    def __init__(self, dist, group, size, rank):
        self.dist, self.group, self.size, self.rank = dist, group, size, rank

    def all_gather(self, t):
        if self.size == 1:
            return [t]
        out = [t.new_empty(t.shape) for _ in range(self.size)]
        self.dist.all_gather(out, t.contiguous(), group=self.group)
        return out


class SeqKV:
    """One sequence's K/V on this rank: per-token locations (rows of the per-layer tensors;
    -1 for another rank's token) as SGLang's req_to_token row."""

    def __init__(self, ks, vs, locs):
        self.ks, self.vs, self.locs = ks, vs, locs

    def loc(self, pos):
        return int(self.locs[pos])

    def own_rows(self, n):
        """This rank's locations among positions [0, n), in position order (int64)."""
        locs = self.locs[:n]
        return locs[locs >= 0]


# --- the engine's pools (SGLang's req_to_token_pool and token_to_kv_pool_allocator) -------

class TokenToKVPoolAllocator:
    """This rank's paged allocator of token locations (SGLang's PagedTokenToKVPoolAllocator):
    a page slot s holds locations s*PAGE_TOKENS ..; alloc(n) gives whole pages' locations,
    free(indices) takes back the pages of page-aligned locations. A slot handed out is
    poisoned (its K/V rows set to NaN), as a freshly reused pool slot holds garbage: a read
    of a slot before its K/V is written or loaded shows in the outputs."""

    def __init__(self, torch, slots, kv_tensors):
        self.torch, self.size, self.kv = torch, slots, kv_tensors
        self.free_slots, self.out, self.bad = list(range(slots - 1, -1, -1)), set(), 0

    def available_size(self):
        return len(self.free_slots) * PAGE_TOKENS

    def alloc(self, n):
        """n tokens' locations, whole pages (SGLang's alloc): an int64 tensor, or None when
        the pool has too few free pages."""
        pages = -(-n // PAGE_TOKENS)
        if pages > len(self.free_slots):
            return None
        got = [self.free_slots.pop() for _ in range(pages)]
        self.out.update(got)
        for s in got:
            for t in self.kv:
                t[s * PAGE_TOKENS:(s + 1) * PAGE_TOKENS] = POISON
        return locations(self.torch, got)[:n]

    def free(self, indices):
        """Frees the pages of indices' page-aligned locations (-1s ignored); a page freed
        twice or never handed out is counted in bad."""
        idx = self.torch.as_tensor(indices, dtype=self.torch.int64)
        for s in (idx[(idx >= 0) & (idx % PAGE_TOKENS == 0)] // PAGE_TOKENS).tolist():
            if s not in self.out:
                self.bad += 1
                continue
            self.out.remove(s)
            self.free_slots.append(s)


def locations(torch, slots):
    """The token locations of page slots (each slot's PAGE_TOKENS rows), int64."""
    s = torch.as_tensor(list(slots), dtype=torch.int64)
    return (s.unsqueeze(1) * PAGE_TOKENS + torch.arange(PAGE_TOKENS)).reshape(-1)


class ReqToTokenPool:
    """SGLang's req_to_token_pool: per request slot, the token locations of its sequence."""

    def __init__(self, torch, size, max_tokens):
        self.req_to_token = torch.full((size, max_tokens), -1, dtype=torch.int64)
        self.free_slots = list(range(size - 1, -1, -1))

    def alloc(self):
        return self.free_slots.pop()

    def free(self, i):
        self.req_to_token[i] = -1
        self.free_slots.append(i)


class Req:
    """The fields of SGLang's Req that the prefix cache reads."""

    def __init__(self, rid, origin_input_ids, extra_key=None):
        self.rid, self.origin_input_ids, self.extra_key = rid, list(origin_input_ids), extra_key
        self.output_ids = []
        self.fill_ids = list(origin_input_ids)
        self.req_pool_idx = None
        self.prefix_indices = None
        self.last_node = None


# --- the scheduler ---------------------------------------------------------------------------

def conversations(clients, turns, seed=7):
    """Per client, per turn, the new user tokens (the prompt is the whole history)."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, VOCAB, size=int(rng.integers(6, 14))).tolist() for _ in range(turns)]
            for _ in range(clients)]


class Scheduler:
    """One request at a time through cpcache.sglang.HiCache, as SGLang's scheduler drives
    HiRadixCache; every decision is a function of replicated state, so every rank of the CP
    group makes the same calls and the same number of steps."""

    def __init__(self, torch, model, tree, cp, kv, scratch, storage, answer_tokens, breaks, timeout_s):
        self.torch, self.model, self.tree, self.cp = torch, model, tree, cp
        self.timeout_s = timeout_s
        self.ks, self.vs = kv
        self.scratch = scratch  # per-layer K, V tensors of the cache-off reference
        self.storage, self.answer_tokens, self.breaks = storage, answer_tokens, breaks
        self.counts = dict(requests=0, prompt_tokens=0, l1_tokens=0, l2_tokens=0, storage_tokens=0,
                           computed_tokens=0, loaded_requests=0, checked=0, differing=0, neighbour_swaps=0)
        self.rid = 0
        self.pool = tree.req_to_token_pool
        self.alloc = tree.token_to_kv_pool_allocator

    def step_while(self, cond, what):
        """Scheduler steps (check_hicache_events) while cond() holds, at most timeout_s seconds."""
        deadline = time.monotonic() + self.timeout_s
        while cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} still pending after {self.timeout_s} s of steps")
            self.tree.check_hicache_events()

    def own(self, page):
        return page % self.cp.size == self.cp.rank

    def grow(self, req, cached, have, n_tokens):
        """Locations for this rank's pages among [have, ceil(n_tokens/P)) of req, after the
        agreed room-making for the request's pages beyond the cache's (cached tokens)."""
        P = PAGE_TOKENS
        want = -(-n_tokens // P)
        if want <= have:
            return have
        if not self.tree.make_room(want * P, cached):
            # Pages whose backups are in flight cannot go: step until none is, then again.
            self.step_while(self.tree.cache.pending, "backups")
            if not self.tree.make_room(want * P, cached):
                raise RuntimeError(f"L1 cannot make room for tokens [{cached}, {want * P}): every page is locked")
        row = self.pool.req_to_token[req.req_pool_idx]
        for i in range(have, want):
            if self.own(i):
                loc = self.alloc.alloc(P)
                if loc is None:
                    raise RuntimeError(f"no free L1 page for page {i} after make_room")
                row[i * P:(i + 1) * P] = loc
        return want

    def generate(self, prompt):
        """Serves one request through the prefix cache: (answer, logits hash)."""
        torch, tree, P, c = self.torch, self.tree, PAGE_TOKENS, self.counts
        req = Req(self.rid, prompt)
        self.rid += 1
        req.req_pool_idx = self.pool.alloc()
        row = self.pool.req_to_token[req.req_pool_idx]
        m = tree.match_prefix(prompt)
        tree.inc_lock_ref(m.last_device_node)
        node = m.last_device_node
        host_before = m.host_hit_length
        if self.storage and len(m.device_indices) + m.host_hit_length < len(prompt) // P * P:
            # The continuation beyond the tree from storage (SGLang's prefetch_from_storage):
            # waited for in scheduler steps, then matched again.
            pid = tree.cache.prefetch(prompt)
            if pid:
                self.step_while(lambda: tree.cache.prefetch_pending(pid), f"prefetch {pid}")
                m = tree.match_prefix(prompt)
                tree.inc_lock_ref(m.last_device_node)
                tree.dec_lock_ref(node)
                node = m.last_device_node
        req.last_node = node
        device = m.device_indices
        loaded = device[:0]
        if m.host_hit_length > 0:
            loaded, _ = tree.init_load_back(node, m.host_hit_length)
        skip_wait = "skip-layer-wait" in self.breaks and len(loaded) > 0
        if len(loaded) and not skip_wait:
            tree.ready_to_load_host_cache()  # a step: the copies start; the forward waits per layer
        prefix = torch.cat([device, loaded])
        c["requests"] += 1
        c["prompt_tokens"] += len(prompt)
        c["l1_tokens"] += len(device)
        if len(loaded):
            c["loaded_requests"] += 1
            from_storage = min(len(loaded), max(0, m.host_hit_length - host_before))
            c["storage_tokens"] += from_storage
            c["l2_tokens"] += len(loaded) - from_storage
        # Reuse whole cached pages, leaving at least one prompt token to compute (its logits).
        reuse = min(len(prefix), (len(prompt) - 1) // P * P)
        row[:reuse] = prefix[:reuse]
        req.prefix_indices = row[:reuse].clone()
        have = self.grow(req, reuse, reuse // P, len(prompt))
        kv = SeqKV(self.ks, self.vs, row)

        def before_layer(layer):
            if len(loaded) and not skip_wait:
                tree.wait_layer(layer, timeout_ms=self.timeout_s * 1000)

        logits = self.model.forward(prompt, reuse, kv, self.cp, before_layer)
        c["computed_tokens"] += len(prompt) - reuse
        if skip_wait:
            tree.ready_to_load_host_cache()  # the broken engine read the loaded layers before their copies started
        if "neighbour-slot" in self.breaks:
            self.swap_neighbours(row, reuse // P, len(prompt) // P)
        tree.cache_unfinished_req(req)
        tokens = list(prompt)
        for i in range(self.answer_tokens):
            req.output_ids.append(int(torch.argmax(logits)))
            tokens.append(req.output_ids[-1])
            if i + 1 < self.answer_tokens:
                have = self.grow(req, len(prompt) // P * P, have, len(tokens))
                logits = self.model.forward(tokens, len(tokens) - 1, kv, self.cp)
            tree.check_hicache_events()  # one decode step
        digest = hashlib.sha256(logits.numpy().tobytes()).hexdigest()
        tree.cache_finished_req(req)
        self.pool.free(req.req_pool_idx)
        return list(req.output_ids), digest

    def swap_neighbours(self, row, lo, hi):
        """The broken path: the first two of this rank's pages in [lo, hi) (computed by this
        request, not yet cached) swap locations, so the cache records each in the other's slot."""
        P = PAGE_TOKENS
        mine = [i for i in range(lo, hi) if self.own(i)]
        if len(mine) >= 2:
            a, b = mine[0], mine[1]
            pa, pb = row[a * P:(a + 1) * P].clone(), row[b * P:(b + 1) * P].clone()
            row[a * P:(a + 1) * P], row[b * P:(b + 1) * P] = pb, pa
            self.counts["neighbour_swaps"] += 1

    def reference(self, prompt):
        """The same request computed without the cache (every token, scratch K/V, the same CP
        split): (answer, logits hash)."""
        torch, P = self.torch, PAGE_TOKENS
        n = len(prompt) + self.answer_tokens
        locs = torch.full((-(-n // P) * P,), -1, dtype=torch.int64)
        slot = 0
        for i in range(-(-n // P)):
            if self.own(i):
                locs[i * P:(i + 1) * P] = locations(torch, [slot])
                slot += 1
        kv = SeqKV(*self.scratch, locs)
        tokens = list(prompt)
        logits = self.model.forward(tokens, 0, kv, self.cp)
        answer = []
        for i in range(self.answer_tokens):
            answer.append(int(torch.argmax(logits)))
            tokens.append(answer[-1])
            if i + 1 < self.answer_tokens:
                logits = self.model.forward(tokens, len(tokens) - 1, kv, self.cp)
        return answer, hashlib.sha256(logits.numpy().tobytes()).hexdigest()

    def serve(self, convs):
        """Runs the conversations round-robin, turn by turn; checks every output against the
        cache-off reference."""
        history = [[] for _ in convs]
        turns = max(len(cv) for cv in convs) if convs else 0
        for turn in range(turns):
            for ci, conv in enumerate(convs):
                if turn >= len(conv):
                    continue
                history[ci] += conv[turn]
                got = self.generate(history[ci])
                want = self.reference(history[ci])
                self.counts["checked"] += 1
                self.counts["differing"] += got != want
                history[ci] += got[0]
        self.step_while(self.tree.cache.pending, "transfers")
        self.tree.reset()  # every location the cache held back to the allocator


# --- the worker processes ----------------------------------------------------------------------

def worker(rank, a, store_port, job_id, results):
    """One rank: torch.distributed over the parent's TCPStore, the cache, the scheduler."""
    try:
        results.put(("done", rank, _worker(rank, a, store_port, job_id)))
    except BaseException as e:  # noqa: BLE001 — reported to the parent, which fails the run
        results.put(("error", rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _worker(rank, a, store_port, job_id):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # one thread: the same reduction order every time
    timeout = datetime.timedelta(seconds=a.timeout)
    store = dist.TCPStore("127.0.0.1", store_port, a.world, False, timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("torch_engine/", store), rank=rank,
                            world_size=a.world, timeout=timeout)
    cp_size, dp = a.attn_cp, a.world // a.attn_cp
    dp_rank, cp_rank = rank // cp_size, rank % cp_size
    groups = [dist.new_group(list(range(d * cp_size, (d + 1) * cp_size))) for d in range(dp)]
    cp = CPGroup(dist, groups[dp_rank], cp_size, cp_rank)

    convs = conversations(a.clients, a.turns)
    convs[-1] = convs[-1][:a.turns - (a.clients * a.turns - a.requests)]  # --requests in all, exactly
    convs = [cv for ci, cv in enumerate(convs) if ci % dp == dp_rank]
    max_tokens = max([sum(len(t) for t in cv) + len(cv) * a.answer_tokens for cv in convs] + [PAGE_TOKENS])
    max_pages = -(-max_tokens // PAGE_TOKENS)
    l1_pages = a.l1_pages or -(-18 // cp_size) + 2

    shape = (l1_pages * PAGE_TOKENS, KV_HEADS, HEAD_DIM)
    ks = [torch.zeros(shape, dtype=torch.float32) for _ in range(LAYERS)]
    vs = [torch.zeros(shape, dtype=torch.float32) for _ in range(LAYERS)]
    own_max = -(-max_pages // cp_size)
    sshape = (own_max * PAGE_TOKENS, KV_HEADS, HEAD_DIM)
    scratch = ([torch.zeros(sshape, dtype=torch.float32) for _ in range(LAYERS)],
               [torch.zeros(sshape, dtype=torch.float32) for _ in range(LAYERS)])

    extra = {}
    if a.kv_events:
        extra["kv_events"] = a.kv_events
    if a.kv_events_replay:
        extra["kv_events_replay"] = a.kv_events_replay
    bufs = [(l, 0, ks[l]) for l in range(LAYERS)] + [(l, 1, vs[l]) for l in range(LAYERS)]
    # The cache meets its peers through the engine's own store (the parent's TCPStore: keys
    # under cpcache/ only), under this run's job id.
    cache = cpcache.Cache(world=a.world, rank=rank, dp=dp, attn_cp=cp_size, store=store, job_id=job_id,
                          local_world=a.world,
                          page_tokens=PAGE_TOKENS,
                          l1_pages=l1_pages, l2_pages=a.l2_pages, l1_mode="engine_owned", kv_layout=KV_SPEC,
                          l1_buffers=bufs, storage_url=a.storage, model=MODEL_NAME if a.storage else None,
                          timeout_ms=a.timeout * 1000, **extra)
    try:
        model = Model(torch)
        alloc = TokenToKVPoolAllocator(torch, l1_pages, ks + vs)
        pool = ReqToTokenPool(torch, 4, max_pages * PAGE_TOKENS)
        tree = HiCache(cache, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=PAGE_TOKENS)
        sched = Scheduler(torch, model, tree, cp, (ks, vs), scratch, a.storage, a.answer_tokens, a.break_,
                          a.timeout)
        sched.serve(convs)
        st = cache.stats()  # after the final reset: every location is back with the allocator
        out = dict(sched.counts, rank=rank, dp_rank=dp_rank, cp_rank=cp_rank, slots_out=len(alloc.out),
                   bad_slots=alloc.bad,
                   stats={k: st[k] for k in ("l1_hit_pages", "l2_hit_pages", "loaded_pages", "storage_hit_pages",
                                             "storage_prefetched_pages", "storage_backed_up_pages", "steps",
                                             "digest_mismatches")})
    finally:
        cache.close()
    dist.barrier()
    dist.destroy_process_group()
    return out


# --- the parent --------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="worker processes (ranks)")
    ap.add_argument("--attn-cp", type=int, default=None, help="CP group size (default: the world)")
    ap.add_argument("--requests", type=int, default=12, help="requests in all (conversations of --turns turns)")
    ap.add_argument("--turns", type=int, default=3, help="turns of each conversation")
    ap.add_argument("--answer-tokens", type=int, default=6)
    ap.add_argument("--l1-pages", type=int, default=0, help="L1 page slots per rank (0: 18/attn-cp + 2)")
    ap.add_argument("--l2-pages", type=int, default=256)
    ap.add_argument("--storage", default=None, metavar="URL", help="L3 storage (file:///dir, redis://...)")
    ap.add_argument("--kv-events", default=None, metavar="ENDPOINT", help="publish KV events (vLLM's format)")
    ap.add_argument("--kv-events-replay", default=None, metavar="ENDPOINT",
                    help="answer replay requests of KV-event batches (with --kv-events)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds any rank waits for its peers")
    ap.add_argument("--break", dest="break_", action="append", default=[], choices=BREAKS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.attn_cp = a.attn_cp or a.world
    if a.world < 1 or a.attn_cp < 1 or a.world % a.attn_cp:
        ap.error(f"--world {a.world} is not a multiple of --attn-cp {a.attn_cp}")
    if a.requests < 1 or a.turns < 1:
        ap.error(f"--requests {a.requests} and --turns {a.turns} must be positive")
    if a.kv_events_replay and not a.kv_events:
        ap.error(f"--kv-events-replay {a.kv_events_replay} needs --kv-events")
    a.clients = -(-a.requests // a.turns)

    import torch.distributed as dist
    t0 = time.monotonic()
    store = dist.TCPStore("127.0.0.1", 0, a.world + 1, True, datetime.timedelta(seconds=a.timeout),
                          wait_for_workers=False)
    job_id = f"torch-engine-{os.getpid()}-{store.port}"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, store.port, job_id, results), name=f"rank{r}")
             for r in range(a.world)]
    for p in procs:
        p.start()
    got, errors = {}, []
    deadline = time.monotonic() + a.timeout * 3
    try:
        while len(got) + len(errors) < a.world:
            try:
                kind, rank, val = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                errors.append(f"no result within {a.timeout * 3} s; exited with failure: {dead}")
                break
            if kind == "done":
                got[rank] = val
            else:
                errors.append(f"rank {rank}: {val}")
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    dp = a.world // a.attn_cp
    firsts = [got[d * a.attn_cp] for d in range(dp)]
    checked = sum(r["checked"] for r in firsts)
    # A replica differs where any of its ranks saw a difference.
    differing = sum(max(got[d * a.attn_cp + i]["differing"] for i in range(a.attn_cp)) for d in range(dp))
    tok = {k: sum(r[k] for r in firsts) for k in ("l1_tokens", "l2_tokens", "storage_tokens", "prompt_tokens",
                                                  "computed_tokens")}
    slots_out = sum(r["slots_out"] + r["bad_slots"] for r in got.values())
    for r in sorted(got.values(), key=lambda r: r["rank"]):
        print(f"rank {r['rank']} (dp {r['dp_rank']}, cp {r['cp_rank']}/{a.attn_cp}): requests={r['requests']} "
              f"loaded_requests={r['loaded_requests']} slots_out={r['slots_out']} "
              f"bad_slots={r['bad_slots']} " + " ".join(f"{k}={v}" for k, v in r["stats"].items()))
    print(f"world {a.world}, attn-cp {a.attn_cp}, {dp} replica(s): prompt tokens {tok['prompt_tokens']}, "
          f"computed {tok['computed_tokens']}, {time.monotonic() - t0:.1f} s")
    print(f"hits: L1 {tok['l1_tokens']} L2 {tok['l2_tokens']} storage {tok['storage_tokens']} tokens")
    print(f"outputs checked {checked}, differing {differing}")
    if slots_out:
        print(f"{slots_out} L1 slots not handed back to the engine's allocator (or handed back twice)",
              file=sys.stderr)
    return 1 if differing or slots_out else 0


if __name__ == "__main__":
    sys.exit(main())
