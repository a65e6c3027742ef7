#!/usr/bin/env python3
"""Where an SGLang-style HiCache controller's calls go in cpcache, as a runnable rank.

SGLang's HiRadixCache and its HiCacheController make these calls per request and per
scheduler step; HiCacheController below maps each onto the cpcache API (ctypes binding of
libcpcache). The scheduler under it serves a synthetic multi-turn workload — each turn's
prompt is the conversation so far plus a question — and checks the bytes of every page it
reads back from L2.

Run every rank of a job, e.g.:
    cpcache launch -n 4 -- /usr/bin/python3 python/examples/hicache_controller.py --attn-cp 4
--engine-slots runs the engine-owned flow (l1_mode="engine_owned"): the engine's own slot
allocator gives the slots of this rank's pages before "compute", the KV is written there, the
sequence is inserted with them, every slot the cache lets go returns to the allocator, and
load-backs land in slots it allocates; after the final flush every slot must be back.
--forever keeps serving new conversations until Ctrl-C: the rank then closes its cache and
exits with status 130 (peers see it as lost and stop too).
"""

import argparse
import hashlib
import os
import signal
import sys

try:
    import cpcache  # installed: make install, or the wheel (make wheel)
except ImportError:  # run from a checkout: the package beside this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import cpcache  # noqa: E402

PAGE_TOKENS, PAGE_BYTES = 16, 256
# --kv-buffers: the engine's KV as per-(layer, part) numpy arrays, SGLang's token-slot layout
# ([l1_pages × PAGE_TOKENS, KV_ROW] per layer for K and for V) lent to the cache; a page's
# PAGE_BYTES are laid out page-first (layer 0's K, V, layer 1's ...) across them.
KV_SPEC, KV_LAYERS, KV_ROW = "layers=2;k=4:sharded;v=4:sharded", 2, 4


class KVBuffers:
    """The engine's per-layer K and V arrays, and a page's bytes read from / written to them."""

    def __init__(self, np, l1_pages):
        self.np = np
        self.arrays = {(l, j): np.zeros((l1_pages * PAGE_TOKENS, KV_ROW), dtype=np.uint8)
                       for l in range(KV_LAYERS) for j in range(2)}

    def buffers(self):
        return [cpcache.token_slot_buffer(l, j, a, PAGE_TOKENS) for (l, j), a in self.arrays.items()]

    def _rows(self, slot):
        return slice(slot * PAGE_TOKENS, (slot + 1) * PAGE_TOKENS)

    def write(self, slot, page):
        chunk = PAGE_TOKENS * KV_ROW
        for (l, j), a in self.arrays.items():
            off = (l * 2 + j) * chunk
            a[self._rows(slot)] = self.np.frombuffer(page[off:off + chunk], dtype=self.np.uint8).reshape(PAGE_TOKENS, KV_ROW)

    def read(self, slot):
        return b"".join(self.arrays[(l, j)][self._rows(slot)].tobytes() for l in range(KV_LAYERS) for j in range(2))


class SlotAllocator:
    """The engine's own L1 slot allocator (SGLang's token_to_kv_pool_allocator, by page): a
    slot handed back that is not out (freed twice, never given) is counted in bad_slots."""

    def __init__(self, size):
        self.free, self.out, self.bad_slots = list(range(size - 1, -1, -1)), set(), 0

    def take(self, n):
        if n > len(self.free):
            raise RuntimeError(f"{n} slots wanted, {len(self.free)} free (room was checked)")
        got = [self.free.pop() for _ in range(n)]
        self.out.update(got)
        return got

    def give_back(self, slots):
        for s in slots:
            if s not in self.out:
                self.bad_slots += 1
                continue
            self.out.remove(s)
            self.free.append(s)


class HiCacheController:
    """SGLang HiCache call → cpcache call. Replicated calls ([R]) happen on every rank of the
    replica group in the same order, as SGLang's scheduler makes them on every TP rank."""

    def __init__(self, cache):
        self.cache = cache

    def match_prefix(self, key):
        """HiRadixCache.match_prefix → match [R]: device indices (L1 slots), last node, and the
        host hit (pages only in L2) that init_load_back can bring back."""
        m = self.cache.match(key)
        return m.l1_slots, m.node, m.host_pages * PAGE_TOKENS

    def inc_lock_ref(self, node):
        """inc_lock_ref → lock [R]."""
        self.cache.lock(node)

    def dec_lock_ref(self, node):
        """dec_lock_ref → unlock [R]."""
        self.cache.unlock(node)

    def init_load_back(self, last_node, host_hit_length):
        """init_load_back / load_back → load_back [R]: allocates L1 slots; this rank's reads of
        its own pages start at the next step. Returns the pages loading."""
        return self.cache.load_back(last_node) if host_hit_length > 0 else 0

    def loading_check(self, node):
        """loading_check → load_pending [R]: True until the group agreed the loads are over."""
        return self.cache.load_pending(node)

    def ready_to_load_host_cache(self, node):
        """The layer-wise wait before attention reads loaded KV → wait_l1 [L]."""
        self.cache.wait_l1(node)

    def insert(self, key):
        """cache_finished_req / cache_unfinished_req → insert [R]: the pages to fill, each with
        its L1 slot and whether this rank owns it."""
        return self.cache.insert(key)

    def write_backup(self, node):
        """write_backup: no call. The write policy (write_through here) backs inserted pages up
        to the CP group's L2 slabs; the copies start at the next step, after the model wrote
        the KV."""

    def check_hicache_events(self):
        """The per-step sync (writing_check and the all_reduce of finished transfers) → step
        [R], exactly once per scheduler step on every rank: one collective agrees on finished
        backups and loads, then starts the copies chosen since the last step."""
        self.cache.step()

    def evict(self, num_tokens):
        """evict (device pool pressure) → evict_l1 [R]: the tokens freed now plus, under
        write_back, those freed at the step that commits their backup (SGLang waits for
        those backups inside evict; here the next steps commit them)."""
        freed, pending = self.cache.evict_l1(num_tokens // PAGE_TOKENS)
        return (freed + pending) * PAGE_TOKENS


def page_content(tokens, index, shard):
    """KV bytes of page `index`: a function of its token prefix and this rank's TP shard."""
    h = hashlib.blake2b(digest_size=64)
    h.update(repr((tokens[: (index + 1) * PAGE_TOKENS], index, shard)).encode())
    return h.digest() * (PAGE_BYTES // 64)


def conversation(client, rnd, with_answer):
    toks = []
    for r in range(rnd + 1):
        toks += [(client * 7919 + r * 131 + t * 17) % 32000 for t in range(40)]
        if r < rnd or with_answer:
            toks += [(client * 104729 + r * 151 + t * 13 + 5) % 32000 for t in range(24)]
    return toks


class Scheduler:
    """Admit, compute, finish — one step at a time, the same on every rank of the replica."""

    def __init__(self, ctl, info, kv=None, alloc=None):
        self.ctl, self.info, self.kv, self.alloc = ctl, info, kv, alloc
        self.interrupted = False  # set by --forever's SIGINT handler; step() acts on it
        self.counts = dict(requests=0, input_tokens=0, tokens_hit_l1=0, tokens_hit_l2=0, tokens_missed=0,
                           scheduler_steps=0, pages_verified=0, bad_pages=0)

    def own(self, index):
        return index % self.info.cp_size == self.info.cp_rank

    def write_pages(self, tokens, fill):
        for p in fill:
            if p.owned:  # each CP rank computes the KV of the pages it owns
                content = page_content(tokens, p.index, self.info.tp_rank)
                if self.kv:
                    self.kv.write(p.slot, content)
                else:
                    self.ctl.cache.l1_page(p.slot)[:] = content

    def compute_into(self, slot, tokens, index):
        content = page_content(tokens, index, self.info.tp_rank)
        if self.kv:
            self.kv.write(slot, content)
        else:
            self.ctl.cache.l1_page(slot)[:] = content

    def ensure_room(self, lo, hi):
        """--engine-slots: the agreed cross-rank eviction (make_room) so that every CP rank's
        allocator has room for its pages among sequence pages [lo, hi); the freed locations'
        pages go back to the allocator. False when nothing more can be evicted."""
        made = self.ctl.cache.make_room(hi * PAGE_TOKENS, lo * PAGE_TOKENS)
        self.alloc.give_back([int(loc) // PAGE_TOKENS for loc in made.freed[::PAGE_TOKENS]])
        return made.room

    def insert_engine_slots(self, tokens):
        """insert with the engine's slots: room first, then slots for this rank's new pages,
        their KV computed into them; the hit's own pages keep the slots the match gave. None
        when L1 cannot make room."""
        cache, pages = self.ctl.cache, len(tokens) // PAGE_TOKENS
        m = cache.match(tokens)
        cache.lock(m.node)  # the hit stays while room is made
        ok = self.ensure_room(m.device_pages, pages)
        cache.unlock(m.node)
        if not ok:
            return None
        own = []
        for i in range(self.info.cp_rank, pages, self.info.cp_size):
            if i < m.device_pages:
                own.append(m.l1_slots[i])
            else:
                slot = self.alloc.take(1)[0]
                self.compute_into(slot, tokens, i)
                own.append(slot)
        res = cache.insert_slots(tokens, own)
        self.alloc.give_back(res.freed)
        return res

    def load_back_engine_slots(self, node, device, host_pages):
        """load_back into the engine's slots: the plan says how many this rank allocates."""
        cache = self.ctl.cache
        if host_pages == 0 or not self.ensure_room(device, device + host_pages):
            return 0
        dst = self.alloc.take(len(cache.load_back_plan(node)))
        try:
            res = cache.load_back_slots(node, dst)
        except cpcache.Error:
            self.alloc.give_back(dst)  # on an error the caller keeps its slots
            raise
        self.alloc.give_back(res.freed)
        return res.pages

    def evict(self, pages):
        if self.alloc:
            self.alloc.give_back(self.ctl.cache.evict_l1_slots(pages).slots)
        else:
            self.ctl.evict(pages * PAGE_TOKENS)

    def with_room(self, call, *args):
        """call(*args), making room in L1 once if it is full: pages with backups in flight
        cannot be evicted, so step until none is, then evict. Every rank sees the same
        L1FullError at the same call (L1 accounting is replicated), so all make the same steps."""
        try:
            return call(*args)
        except cpcache.L1FullError:
            while self.ctl.cache.pending():
                self.step()
            self.ctl.evict(self.info.l1_pages // 2 * PAGE_TOKENS)
            return call(*args)

    def prefill(self, tokens):
        slots, node, host_tokens = self.ctl.match_prefix(tokens)
        self.ctl.inc_lock_ref(node)
        device = len(slots)
        if self.alloc:
            loading = self.load_back_engine_slots(node, device, host_tokens // PAGE_TOKENS)
        else:
            loading = self.with_room(self.ctl.init_load_back, node, host_tokens)
        if loading:
            while self.ctl.loading_check(node):  # the copies run from the next step on
                self.step()
            slots, after, _ = self.ctl.match_prefix(tokens)  # the same hit on every rank
            self.ctl.ready_to_load_host_cache(after)
        for i, slot in enumerate(slots):
            if self.own(i):
                self.counts["pages_verified"] += 1
                got = self.kv.read(slot) if self.kv else bytes(self.ctl.cache.l1_page(slot))
                if got != page_content(tokens, i, self.info.tp_rank):
                    self.counts["bad_pages"] += 1
        if self.alloc:
            res = self.insert_engine_slots(tokens)
            if res is None:
                raise RuntimeError("L1 cannot make room for a prompt (every page locked)")
        else:
            res = self.with_room(self.ctl.insert, tokens)
            self.write_pages(tokens, res.fill)
        self.ctl.inc_lock_ref(res.node)
        self.ctl.dec_lock_ref(node)
        c = self.counts
        l1, l2 = device * PAGE_TOKENS, (len(slots) - device) * PAGE_TOKENS
        c["requests"] += 1
        c["input_tokens"] += len(tokens)
        c["tokens_hit_l1"] += l1
        c["tokens_hit_l2"] += l2
        c["tokens_missed"] += len(tokens) - l1 - l2
        return res.node

    def finish(self, client, rnd, node):
        tokens = conversation(client, rnd, True)
        if self.alloc:
            self.insert_engine_slots(tokens)  # best effort: None leaves the answer uncached
            self.ctl.dec_lock_ref(node)
            return
        try:
            res = self.ctl.insert(tokens)
            self.write_pages(tokens, res.fill)
        except cpcache.L1FullError:
            pass  # the answer is not cached; every rank sees the same
        self.ctl.dec_lock_ref(node)

    def step(self):
        if self.interrupted:
            # Ctrl-C takes effect here, between steps: a KeyboardInterrupt raised wherever the
            # signal lands could fall inside a finalizer or a weakref callback, where Python
            # prints and drops it, and the loop would go on serving.
            raise KeyboardInterrupt
        self.ctl.check_hicache_events()
        self.counts["scheduler_steps"] += 1
        if self.alloc:
            self.alloc.give_back(self.ctl.cache.take_freed_l1())

    def l1_used(self):
        """The fullest CP rank's L1 pages: equal on every rank (l1_used_by is replicated)."""
        return max(self.ctl.cache.l1_used_by(r) for r in range(self.info.cp_size))

    def serve(self, clients, rounds):
        """Serves rounds turns of clients (this replica's share), one request per step with a
        short decode, then steps until no transfer is in flight."""
        for rnd in range(rounds):
            for client in clients:
                node = self.prefill(conversation(client, rnd, False))
                for _ in range(3):  # decode steps
                    self.step()
                self.finish(client, rnd, node)
                if self.l1_used() > self.info.l1_pages // 2:
                    self.evict(self.info.l1_pages // 4)
        while self.ctl.cache.pending() > 0:
            self.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attn-cp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--dp-attention", action="store_true")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--l1-pages", type=int, default=16,
                    help="this rank's L1 page slots (each CP rank holds only the pages it owns)")
    ap.add_argument("--forever", action="store_true", help="serve new conversations until Ctrl-C")
    ap.add_argument("--kv-buffers", action="store_true",
                    help="lend the cache per-layer K/V numpy arrays (needs numpy) instead of its page pool")
    ap.add_argument("--l2-layout", choices=["page_first", "layer_first"], default="page_first")
    ap.add_argument("--engine-slots", action="store_true",
                    help="the engine's own slot allocator picks every L1 slot (l1_mode engine_owned)")
    a = ap.parse_args()
    kv, extra = None, {}
    if a.kv_buffers:
        import numpy as np
        kv = KVBuffers(np, a.l1_pages)
        extra = dict(kv_layout=KV_SPEC, l1_buffers=kv.buffers(), l2_layout=a.l2_layout)
    cache = cpcache.Cache(attn_cp=a.attn_cp, dp=a.dp, dp_attention=a.dp_attention, page_tokens=PAGE_TOKENS,
                          page_bytes=PAGE_BYTES, l1_pages=a.l1_pages, l2_pages=512,
                          l1_mode="engine_owned" if a.engine_slots else None, **extra)
    sched = None
    try:
        info = cache.info
        alloc = SlotAllocator(info.l1_pages) if a.engine_slots else None
        sched = Scheduler(HiCacheController(cache), info, kv, alloc)
        dp = info.world // info.replica_size
        mine = [c for c in range(a.clients) if c % dp == info.dp_rank]
        if a.forever:
            signal.signal(signal.SIGINT, lambda *_: setattr(sched, "interrupted", True))
            print(f"rank {info.rank}: serving until interrupted", flush=True)
            base = 0
            while True:
                sched.serve([base + c for c in mine], a.rounds)
                base += a.clients
        sched.serve(mine, a.rounds)
        slots = ""
        if alloc:  # the final flush lets every slot go: all must be back
            cache.flush()
            alloc.give_back(cache.take_freed_l1())
            slots = f" slots_out={len(alloc.out)} bad_slots={alloc.bad_slots}"
        st = cache.stats()
        c = sched.counts
        hit = (c["tokens_hit_l1"] + c["tokens_hit_l2"]) / max(1, c["input_tokens"])
        print(f"rank {info.rank}/{info.world} (cp {info.cp_rank}/{info.cp_size}, dp {info.dp_rank}): "
              + " ".join(f"{k}={v}" for k, v in c.items())
              + f" hit_rate={hit:.3f} pages_written_l2={st['pages_written_l2']} pages_loaded_l2={st['pages_loaded_l2']}"
              f" consensus_steps={st['steps']} digest_mismatches={st['digest_mismatches']}{slots}", flush=True)
        slots_bad = alloc is not None and (alloc.out or alloc.bad_slots)
        return 1 if c["bad_pages"] or st["digest_mismatches"] or st["steps"] != c["scheduler_steps"] or slots_bad else 0
    except KeyboardInterrupt:
        steps = sched.counts["scheduler_steps"] if sched else 0
        print(f"rank {cache.info.rank}: interrupted after {steps} steps; closing the cache", flush=True)
        return 130
    finally:
        cache.close()


if __name__ == "__main__":
    sys.exit(main())
