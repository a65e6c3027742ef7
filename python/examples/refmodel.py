"""A tiny deterministic transformer as a real client of the cache, through the Python binding.

The model (Llama-style: RMSNorm, RoPE, grouped-query attention, SwiGLU; float32, d=64, 4
layers, vocabulary 512, 4 query heads over 2 KV heads of 16; weights from numpy's seeded
Generator) keeps the K and V of every token in per-layer arrays indexed by token slot, and
those arrays ARE the cache's L1: they are lent to it as its per-layer buffers (l1_buffers,
token-slot layout), in engine-owned mode (l1_mode="engine_owned"). The engine's own slot
allocator gives the slots, the model writes the KV there, insert_slots adopts them, every slot
the cache lets go goes back to the allocator, and a hit's L2 pages are loaded back into slots
the allocator gives (load_back_plan, load_back_slots), waited layer by layer (wait_l1_layer)
before the model reads that layer.

Determinism: a token's K/V and logits are computed one token at a time (matrix-vector
products whose shapes depend only on the position), never in a batch whose size varies, so a
prefix served from the cache gives bit-identical outputs to one recomputed: serving the same
conversations with the cache off must give the same tokens and the same final logits (hash
of their bytes), and any difference is a data-path fault. It is not bit-identical to the Go
model (sim/refmodel); it follows the same recipe. World 1 (one rank; CP is the Go oracle's).

Run: python3 python/examples/refmodel.py [--torch]   (prints the comparison and counters)
"""
import argparse
import hashlib
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cpcache  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF = 512, 64, 4, 4, 2, 16, 128
PAGE_TOKENS = 4
# Per layer a K and a V part of KV_HEADS*HEAD_DIM float32s a token: 128 bytes each.
KV_SPEC = f"layers={LAYERS};k={KV_HEADS * HEAD_DIM * 4}:sharded;v={KV_HEADS * HEAD_DIM * 4}:sharded"


class Model:
    """The weights, drawn from seed; forward() computes tokens one at a time into a KV store."""

    def __init__(self, seed=1):
        rng = np.random.default_rng(seed)

        def mat(out, inp):
            return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

        def norm(n):
            return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

        self.embed = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append(dict(
                attn_norm=norm(DIM), wq=mat(HEADS * HEAD_DIM, DIM), wk=mat(KV_HEADS * HEAD_DIM, DIM),
                wv=mat(KV_HEADS * HEAD_DIM, DIM), wo=mat(DIM, HEADS * HEAD_DIM), mlp_norm=norm(DIM),
                wg=mat(FF, DIM), wu=mat(FF, DIM), wd=mat(DIM, FF)))
        self.final_norm = norm(DIM)
        self.lm_head = mat(VOCAB, DIM)
        self.inv_freq = np.power(10000.0, -np.arange(0, HEAD_DIM, 2) / HEAD_DIM)  # float64

    @staticmethod
    def _rms_norm(x, g):
        return (x / np.float32(np.sqrt(np.mean(x * x, dtype=np.float32) + np.float32(1e-6))) * g).astype(np.float32)

    def _rope(self, x, pos):
        """Rotates each pair (2i, 2i+1) of every head of x [heads, HEAD_DIM] by pos·10000^(-2i/HEAD_DIM)."""
        theta = pos * self.inv_freq
        c, s = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2], out[:, 1::2] = a * c - b * s, a * s + b * c
        return out

    def forward(self, tokens, start, kv, before_layer=None):
        """Computes tokens[start:], writing each one's K/V of every layer through kv (a KVStore:
        kv.k(layer, pos) and kv.v(layer, pos) are writable [KV_HEADS, HEAD_DIM] views), reading
        tokens[:start]'s from it, and returns the last token's logits. before_layer(l) runs
        before layer l reads any K/V (the cache's layer-wise wait for a loaded prefix)."""
        xs = [self.embed[t].copy() for t in tokens[start:]]
        group = HEADS // KV_HEADS
        scale = np.float32(1 / np.sqrt(HEAD_DIM))
        for l, w in enumerate(self.layers):
            if before_layer is not None:
                before_layer(l)
            for i, x in enumerate(xs):
                pos = start + i
                h = self._rms_norm(x, w["attn_norm"])
                q = self._rope((w["wq"] @ h).reshape(HEADS, HEAD_DIM), pos)
                kv.k(l, pos)[:] = self._rope((w["wk"] @ h).reshape(KV_HEADS, HEAD_DIM), pos)
                kv.v(l, pos)[:] = (w["wv"] @ h).reshape(KV_HEADS, HEAD_DIM)
                keys, vals = kv.keys(l, pos + 1), kv.values(l, pos + 1)  # [pos+1, KV_HEADS, HEAD_DIM]
                attn = np.empty((HEADS, HEAD_DIM), dtype=np.float32)
                for hh in range(HEADS):
                    kh = hh // group
                    scores = (keys[:, kh, :] @ q[hh]) * scale
                    e = np.exp(scores - scores.max())
                    attn[hh] = (e @ vals[:, kh, :]) / e.sum(dtype=np.float32)
                x += w["wo"] @ attn.reshape(-1)
                h = self._rms_norm(x, w["mlp_norm"])
                g = w["wg"] @ h
                x += w["wd"] @ ((g / (1 + np.exp(-g))) * (w["wu"] @ h))
        return self.lm_head @ self._rms_norm(xs[-1], self.final_norm)


class KVStore:
    """A sequence's K/V in the per-layer slot arrays: position pos is row pos % PAGE_TOKENS of
    the page slot page_table[pos // PAGE_TOKENS]."""

    def __init__(self, ks, vs, page_table):
        self.ks, self.vs, self.page_table = ks, vs, page_table

    def _row(self, pos):
        return self.page_table[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS

    def k(self, layer, pos):
        return self.ks[layer][self._row(pos)]

    def v(self, layer, pos):
        return self.vs[layer][self._row(pos)]

    def _gather(self, arrays, layer, n):
        rows = [self._row(p) for p in range(n)]
        return arrays[layer][rows]

    def keys(self, layer, n):
        return self._gather(self.ks, layer, n)

    def values(self, layer, n):
        return self._gather(self.vs, layer, n)


class SlotAllocator:
    """The engine's L1 slot allocator; a slot handed back that is not out is an error."""

    def __init__(self, size):
        self.free, self.out = list(range(size - 1, -1, -1)), set()

    def take(self, n):
        if n > len(self.free):
            raise RuntimeError(f"{n} slots wanted, {len(self.free)} free")
        got = [self.free.pop() for _ in range(n)]
        self.out.update(got)
        return got

    def give_back(self, slots):
        for s in slots:
            if s not in self.out:
                raise RuntimeError(f"slot {s} handed back but not out (freed twice or never given)")
            self.out.remove(s)
            self.free.append(s)


def kv_arrays(slots, use_torch=False):
    """Per-layer K and V slot arrays [slots*PAGE_TOKENS, KV_HEADS, HEAD_DIM] float32: the lent
    objects (numpy arrays, or torch CPU tensors) and numpy views of the same memory."""
    shape = (slots * PAGE_TOKENS, KV_HEADS, HEAD_DIM)
    if use_torch:
        import torch
        lent = [[torch.zeros(shape, dtype=torch.float32) for _ in range(LAYERS)] for _ in range(2)]
        return lent, [[t.numpy() for t in part] for part in lent]
    lent = [[np.zeros(shape, dtype=np.float32) for _ in range(LAYERS)] for _ in range(2)]
    return lent, lent


class Engine:
    """Serves requests (prompt → greedy answer) with the model; with cache (a cpcache.Cache
    over the lent arrays) the prefix comes from L1 or is loaded back from L2, else every
    token is recomputed. damage(ks, vs, layer, loaded_slots), if set, runs after the wait for
    each layer of a request that loaded pages back (the broken-path check)."""

    def __init__(self, model, l1_pages, cache=None, arrays=None, damage=None):
        self.model, self.cache, self.damage = model, cache, damage
        _, (self.ks, self.vs) = arrays if arrays is not None else kv_arrays(l1_pages)
        self.alloc = SlotAllocator(l1_pages)
        self.loaded_requests = 0
        self.computed_tokens = 0  # prompt tokens the prefills computed (not served by the cache)

    def _take(self, n):
        """n slots, evicting cached pages (their slots come back) when the allocator is short."""
        short = n - len(self.alloc.free)
        if short > 0 and self.cache is not None:
            ev = self.cache.evict_l1_slots(short)
            self.alloc.give_back(ev.slots)
        return self.alloc.take(n)

    def _settle(self):
        """Steps until nothing is in flight, handing every slot the cache let go back."""
        c = self.cache
        while True:
            c.step()
            self.alloc.give_back(c.take_freed_l1())
            if not c.pending():
                return

    def generate(self, prompt, n_new):
        """The greedy answer of n_new tokens, and the hash of the logits that chose its last."""
        prompt = [int(t) for t in prompt]
        c, P = self.cache, PAGE_TOKENS
        locked, cached_slots, loaded = [], [], []
        if c is not None:
            m = c.match(prompt)
            c.lock(m.node)
            locked.append(m.node)
            if m.host_pages:
                plan = c.load_back_plan(m.node)
                dst = self._take(len(plan))
                res = c.load_back_slots(m.node, dst)
                self.alloc.give_back(res.freed)
                if res.pages:
                    c.step()  # the copies start; wait_l1_layer waits for each layer below
                    self.alloc.give_back(c.take_freed_l1())
                    m = c.match(prompt)
                    c.lock(m.node)
                    locked.append(m.node)
                    taken = set(dst)
                    loaded = [s for s in m.l1_slots if s in taken]
                    self.loaded_requests += 1
            cached_slots = list(m.l1_slots)
            node = m.node
        # Reuse whole cached pages, leaving at least one prompt token to compute (its logits).
        reuse = min(len(cached_slots), (len(prompt) - 1) // P)
        page_table = cached_slots[:reuse]
        mine = []  # this request's own slots, in page order

        def grow(n_tokens):
            while len(page_table) * P < n_tokens:
                s = self._take(1)[0]
                page_table.append(s)
                mine.append(s)

        kv = KVStore(self.ks, self.vs, page_table)

        def before_layer(layer):
            if loaded:
                c.wait_l1_layer(node, layer)
                if self.damage is not None:
                    self.damage(self.ks, self.vs, layer, loaded)

        tokens = list(prompt)
        grow(len(tokens))
        logits = self.model.forward(tokens, reuse * P, kv, before_layer)
        self.computed_tokens += len(prompt) - reuse * P
        answer = []
        for i in range(n_new):
            answer.append(int(np.argmax(logits)))
            tokens.append(answer[-1])
            if i + 1 < n_new:
                grow(len(tokens))
                logits = self.model.forward(tokens, len(tokens) - 1, kv)
        digest = hashlib.sha256(np.ascontiguousarray(logits, dtype=np.float32).tobytes()).hexdigest()
        # The KV that exists: every token but the last answer token.
        whole = (len(tokens) - 1) // P
        if c is not None:
            slots = page_table[:whole]
            res = c.insert_slots(tokens[:whole * P], slots)
            self.alloc.give_back(res.freed)
            self.alloc.give_back(page_table[whole:])  # the partial page is not cached
            for n in locked:
                c.unlock(n)
            self._settle()
        else:
            self.alloc.give_back(mine)
        return answer, digest


def conversations(clients=3, turns=3, seed=7):
    """Per client, per turn, the new user tokens (the prompt is the whole history)."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, VOCAB, size=int(rng.integers(5, 10))).tolist() for _ in range(turns)]
            for _ in range(clients)]


def serve(engine, convs, answer_tokens=6):
    """Runs the conversations round-robin, turn by turn (each turn's prompt holds the previous
    turns' prompts and generated answers): the list of (answer, logits hash) per request."""
    history = [[] for _ in convs]
    out = []
    for turn in range(len(convs[0])):
        for ci, conv in enumerate(convs):
            history[ci] += conv[turn]
            answer, digest = engine.generate(history[ci], answer_tokens)
            history[ci] += answer
            out.append((answer, digest))
    return out


def open_cache(store_dir, l1_pages, lent, l2_layout=None):
    """A one-rank cache in engine-owned mode over the lent per-layer K (part 0) and V (part 1)."""
    bufs = [(l, part, lent[part][l]) for l in range(LAYERS) for part in range(2)]
    return cpcache.Cache(world=1, rank=0, store=f"file://{store_dir}", page_tokens=PAGE_TOKENS, l1_pages=l1_pages,
                         l2_pages=256, l1_mode="engine_owned", kv_layout=KV_SPEC, l1_buffers=bufs,
                         l2_layout=l2_layout)


def run(l1_pages=16, use_torch=False, damage=None, l2_layout=None, convs=None):
    """Serves the conversations with the cache off, then on: (off, on, the cache's stats,
    whether every slot came back, requests that loaded from L2, prompt tokens computed off
    and on)."""
    model = Model()
    convs = convs or conversations()
    off_engine = Engine(model, 1024)
    off = serve(off_engine, convs)
    lent, views = kv_arrays(l1_pages, use_torch)
    with tempfile.TemporaryDirectory() as store:
        with open_cache(store, l1_pages, lent, l2_layout) as c:
            eng = Engine(model, l1_pages, c, (lent, views), damage)
            on = serve(eng, convs)
            stats = c.stats()
            c.flush()
            eng.alloc.give_back(c.take_freed_l1())
            all_back = not eng.alloc.out
    return off, on, stats, all_back, eng.loaded_requests, (off_engine.computed_tokens, eng.computed_tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch", action="store_true", help="lend torch CPU tensors instead of numpy arrays")
    ap.add_argument("--l1-pages", type=int, default=16)
    a = ap.parse_args()
    off, on, st, all_back, loaded, (computed_off, computed_on) = run(a.l1_pages, a.torch)
    differing = sum(x != y for x, y in zip(off, on))
    print(f"refmodel: requests={len(on)} differing={differing} l1_hit_pages={st['l1_hit_pages']} "
          f"l2_hit_pages={st['l2_hit_pages']} loaded_pages={st['loaded_pages']} loaded_requests={loaded} "
          f"slots_back={all_back} prompt_tokens_computed={computed_on}/{computed_off}")
    return 0 if differing == 0 and all_back else 1


if __name__ == "__main__":
    sys.exit(main())
