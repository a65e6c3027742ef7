"""cpcache behind SGLang's prefix-cache interface: HiCache, a class with the method names and
semantics of SGLang's BasePrefixCache / HiRadixCache, over a cpcache.Cache opened with
l1_mode="engine_owned" (SGLang owns its KV pool and its allocator; the cache adopts the
locations the engine computed into and hands back every location it lets go). It imports no
SGLang: requests, pools and allocators are duck-typed by the fields and methods below.

SGLang call → cpcache call (every [R] call is made on every rank of the replica group in the
same order, as SGLang's scheduler makes its tree-cache calls on every TP rank):

  match_prefix(key | params)         → Cache.match(tokens, key=extra_key, out=...) [R]:
                                       MatchResult.device_indices = match().device_indices
                                       (this rank's per-token L1 locations, -1 for another CP
                                       rank's token), last_device_node = last_host_node =
                                       best_match_node = match().node (a cpcache node handle,
                                       an int), host_hit_length = match().host_tokens
  inc_lock_ref(node)                 → Cache.lock(node) [R]
  dec_lock_ref(node)                 → Cache.unlock(node) [R]
  cache_unfinished_req(req)          → Cache.insert_locs(fill_ids, req_to_token row) [R], the
                                       freed locations to allocator.free, then Cache.match to
                                       write the cache's locations into the row; the lock moves
                                       from req.last_node to the new node; req.prefix_indices
                                       and req.last_node are updated, as RadixCache does
  cache_finished_req(req)            → Cache.insert_locs (is_insert) [R]; the duplicates, the
                                       partial last page and (is_insert=False) everything
                                       beyond the prefix go to allocator.free; unlock
  evict(num_tokens | params)         → Cache.evict_locs(num_tokens) [R]; freed → allocator.free
  make_room(end, start)  (cpcache)   → Cache.make_room [R]: the agreed cross-rank eviction
                                       (see "CP" below); freed → allocator.free
  init_load_back(node, host_hit_length, mem_quota)
                                     → Cache.make_room, allocator.alloc(load_back_tokens(node)),
                                       Cache.load_back_locs [R]; returns (device_indices of the
                                       loading tokens, node), the node locked until loaded
  ready_to_load_host_cache()         → Cache.step() when loads were started since the last
                                       step (the copies start at a step) [R]; returns a
                                       consumer index
  wait_layer(layer) (cpcache)        → Cache.wait_l1_layer for the loads of the last
                                       ready_to_load_host_cache: call it in the forward before
                                       layer `layer`'s attention reads loaded KV [L]
  check_hicache_events()             → Cache.step() [R] once per scheduler step, then
                                       Cache.take_freed_locs → allocator.free, loading_check()
  loading_check()                    → Cache.load_pending per loading node; a finished one is
                                       unlocked [R]
  evictable_size() / protected_size() / total_size()
                                     → this rank's tokens in L1 (Cache.l1_used_by(cp_rank) *
                                       page_tokens) split by the locks this class holds
  reset()                            → Cache.flush() (after stepping until idle) [R]; every
                                       location the cache held goes back to the allocator

Not supported: SWA (sliding-window) and Mamba/hybrid-linear state (swa_* and mamba_* fields
are 0), EAGLE's bigram keys, page_size 1 with cpcache page_tokens > 1 (SGLang's page_size must
equal the cache's page_tokens: a paged allocator), storage prefetch through SGLang's
HiCacheStorage (use Cache(storage_url=...): the cache reads storage itself), SGLang's KV events
(cpcache publishes its own), pretty_print. protected_size() counts each locked node's whole
prefix: two locked nodes on one path count their shared tokens twice (an upper bound).

Wiring into SGLang's scheduler (python/sglang/srt/managers/scheduler.py):
  - open the cache in each scheduler (TP/CP rank) process: cpcache.Cache(attn_cp=..., page_tokens=
    server_args.page_size, l1_mode="engine_owned", kv_layout=..., l1_buffers=[cpcache.
    token_slot_buffer(layer, part, k_or_v_buffer, page_size) for each layer's K and V of
    token_to_kv_pool], ...);
  - self.tree_cache = cpcache.sglang.HiCache(cache, req_to_token_pool=self.req_to_token_pool,
    token_to_kv_pool_allocator=self.token_to_kv_pool_allocator, page_size=server_args.page_size)
    in place of HiRadixCache (init_cache_with_memory_pool);
  - the scheduler's calls stay: match_prefix in the schedule policy, inc/dec_lock_ref,
    init_load_back when host_hit_length > 0, ready_to_load_host_cache when a prefill batch is
    formed (its forward then calls tree_cache.wait_layer(i) before layer i's attention — the
    role of layer_transfer_counter), cache_unfinished_req / cache_finished_req, and
    check_hicache_events once per loop iteration on every rank;
  - CP: page i of a sequence lives on CP rank i mod attn_cp; each rank's allocator gives
    locations only for its own pages (-1 for the others in req_to_token). Evictions must be
    the same on every rank, so do not call evict(num_tokens) with a count read from one rank's
    allocator: before allocating a request's locations call tree_cache.make_room(end=
    len(req.fill_ids), start=len(req.prefix_indices)) (replicated counts only; the reserved
    hook of HiCache says what running requests hold outside the cache). At CP 1 SGLang's own
    evict(num_tokens) works unchanged.
"""

import collections

import cpcache

__all__ = ["HiCache", "MatchResult", "EvictResult"]

MatchResult = collections.namedtuple(
    "MatchResult", "device_indices last_device_node last_host_node best_match_node host_hit_length "
    "swa_host_hit_length mamba_host_hit_length", defaults=(0, 0, 0))
MatchResult.__doc__ = """SGLang's MatchResult: device_indices (int64 tensor or numpy array of this
rank's per-token L1 locations of the device hit; -1 for other CP ranks' tokens), the node
handles (all the deepest matched node: cpcache locks and loads by it), host_hit_length
(tokens in L2 only beyond the device hit); swa_/mamba_ lengths are always 0."""
EvictResult = collections.namedtuple("EvictResult", "num_tokens_evicted")


def _field(obj, name, default=None):
    return getattr(obj, name, default)


def _torch():
    import torch
    return torch


def _host(a):
    """A numpy view of an int array, torch tensor or list."""
    if cpcache._is_torch(a):
        return cpcache._host(a)
    return cpcache._numpy().asarray(a)


class HiCache:
    """SGLang's HiRadixCache interface over cpcache (see the module's docstring for the call
    mapping, what is not supported and the scheduler wiring).

    cache: a cpcache.Cache with l1_mode="engine_owned". req_to_token_pool: an object with
    req_to_token, a [requests, max_tokens] int64 tensor or numpy array of token locations
    (-1 where another CP rank holds the token). token_to_kv_pool_allocator: alloc(n) → n
    locations (page-aligned, contiguous per page, as SGLang's paged allocator gives) or None,
    free(locations). page_size: SGLang's page size, which must be the cache's page_tokens
    (None: the cache's). tensors: "torch" or "numpy", the type of device_indices (None: torch
    when req_to_token is a torch tensor). reserved: None, or a function returning, per CP
    rank, the pages the engine holds outside the cache (running requests' uncached pages;
    the same values on every rank): make_room leaves room for them."""

    def __init__(self, cache, req_to_token_pool=None, token_to_kv_pool_allocator=None, page_size=None,
                 tensors=None, reserved=None):
        pt = cache.info.page_tokens
        if page_size is not None and page_size != pt:
            raise ValueError(f"cpcache.sglang: page_size {page_size} is not the cache's page_tokens {pt}")
        self.cache = cache
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = pt
        self.disable = False
        self.reserved = reserved
        if tensors is None:
            rtt = _field(req_to_token_pool, "req_to_token")
            tensors = "torch" if rtt is not None and cpcache._is_torch(rtt) else "numpy"
        if tensors not in ("torch", "numpy"):
            raise ValueError(f"cpcache.sglang: tensors {tensors!r} (want 'torch' or 'numpy')")
        self.tensors = tensors
        self.root_node = 0
        self._locks = {}  # node → [lock count, tokens of its prefix]
        self._depth = {}  # node → tokens of its prefix, as last seen (match, insert)
        self._loading = []  # nodes loading (locked until their loads are over)
        self._new_loads = []  # nodes whose loads start at the next step
        self._waiting = []  # nodes whose loads the last ready_to_load_host_cache started
        self._consumer = 0

    # --- helpers ---

    def _free(self, locs):
        if len(locs) and self.token_to_kv_pool_allocator is not None:
            self.token_to_kv_pool_allocator.free(locs)

    def _empty(self):
        np = cpcache._numpy()
        a = np.empty(0, dtype=np.int64)
        if self.tensors == "torch":
            return _torch().from_numpy(a)
        return a

    @staticmethod
    def _key(key):
        """(tokens, extra_key) of SGLang's RadixKey (token_ids, extra_key), or of tokens."""
        ids = _field(key, "token_ids")
        if ids is None:
            return key, None
        return ids, _field(key, "extra_key")

    def _row(self, req, n):
        return self.req_to_token_pool.req_to_token[req.req_pool_idx][:n]

    @staticmethod
    def _tokens(req, n):
        """The first n of req's origin_input_ids + output_ids, as an int32 array; the prompt's
        conversion is kept on the request (a prompt is not changed in place)."""
        np = cpcache._numpy()
        origin = req.origin_input_ids
        memo = getattr(req, "_cpcache_origin", None)
        if memo is None or memo[0] is not origin or memo[1] != len(origin):
            memo = (origin, len(origin), np.asarray(origin, dtype=np.int32))
            try:
                req._cpcache_origin = memo
            except AttributeError:  # a request type with __slots__: convert every time
                pass
        arr = memo[2]
        if n <= len(arr):
            return arr[:n]
        return np.concatenate([arr, np.asarray(req.output_ids[:n - len(arr)], dtype=np.int32)])

    def _fill_tokens(self, req):
        """req.fill_ids (a prefix of origin_input_ids + output_ids) as int32 tokens, and its length."""
        fill = req.fill_ids
        if not isinstance(fill, list):
            return fill, len(fill)
        return self._tokens(req, len(fill)), len(fill)

    # --- SGLang's interface ---

    def match_prefix(self, key=None, **kwargs):
        """key: token ids (list, numpy array, torch tensor), a RadixKey-like object (token_ids,
        extra_key: the isolation key), or SGLang's MatchPrefixParams (its .key) [R]."""
        if key is None:
            key = kwargs.get("params") or kwargs.get("key")
        inner = _field(key, "key")
        if inner is not None and _field(key, "token_ids") is None:  # MatchPrefixParams
            key = inner
        tokens, extra = self._key(key)
        m = self.cache.match(tokens, key=extra, out=self.tensors)
        self._depth[m.node] = (m.device_tokens, m.host_tokens)
        return MatchResult(m.device_indices, m.node, m.node, m.node, m.host_tokens)

    def inc_lock_ref(self, node):
        """Pins node's prefix against eviction [R]. Returns the tokens newly protected."""
        if not node:
            return 0
        self.cache.lock(node)
        ent = self._locks.get(node)
        if ent is None:
            dt, ht = self._depth.get(node, (0, 0))
            self._locks[node] = [1, dt + ht]
            return dt + ht
        ent[0] += 1
        return 0

    def dec_lock_ref(self, node, params=None):
        """Releases one inc_lock_ref of node [R]. Returns the tokens no longer protected."""
        if not node:
            return 0
        self.cache.unlock(node)
        ent = self._locks.get(node)
        if ent is None:
            return 0
        ent[0] -= 1
        if ent[0] > 0:
            return 0
        del self._locks[node]
        return ent[1]

    def cache_unfinished_req(self, req, chunked=False, **kwargs):
        """Caches req.fill_ids' whole pages with their locations from req_to_token (a chunked
        prefill, or a request kept running) [R]: the locations the cache does not keep go to
        the allocator, the row gets the cache's locations of its pages, the lock moves to the
        new node, req.prefix_indices and req.last_node follow."""
        tokens, n = self._fill_tokens(req)
        pt = self.page_size
        whole = n // pt * pt
        extra = _field(req, "extra_key")
        row = self._row(req, n)
        res = self.cache.insert_locs(tokens[:whole], row[:whole], key=extra, out=self.tensors)
        m = self.cache.match(tokens[:whole], key=extra, out=self.tensors)
        freed = res.freed
        got = m.device_tokens
        if got < whole and len(freed):
            # Pages the cache did not take (quarantined, say) stay the running request's.
            np = cpcache._numpy()
            keep = np.isin(_host(freed), _host(row[got:whole]))
            freed = freed[~keep] if not cpcache._is_torch(freed) else freed[_torch().from_numpy(~keep)]
        self._free(freed)
        self._depth[m.node] = (got, m.host_tokens)
        prefix = len(req.prefix_indices)
        if got > prefix:
            row[prefix:got] = m.device_indices[prefix:got]
        self.inc_lock_ref(m.node)
        self.dec_lock_ref(_field(req, "last_node"))
        req.prefix_indices = row[:n].clone() if self.tensors == "torch" else row[:n].copy()
        req.last_node = m.node
        try:
            req._cpcache_cached = got  # the tokens of the row the cache holds
        except AttributeError:
            pass

    def cache_finished_req(self, req, is_insert=True, **kwargs):
        """Caches a finished request's whole pages (is_insert) with their locations from
        req_to_token, gives the allocator every location the cache does not keep (duplicates,
        the partial last page; with is_insert=False everything past req.prefix_indices), and
        releases the request's lock [R]. The committed tokens: req.kv_committed_len when the
        request has it, else origin_input_ids + output_ids without the last output (whose KV
        was never computed)."""
        n = _field(req, "kv_committed_len")
        if n is None:
            n = len(req.origin_input_ids) + len(req.output_ids) - 1
        pt = self.page_size
        whole = n // pt * pt
        row = self._row(req, n)
        if is_insert:
            tokens = self._tokens(req, whole)
            res = self.cache.insert_locs(tokens, row[:whole], key=_field(req, "extra_key"), out=self.tensors)
            self._free(res.freed)
            tail = row[whole:n]
        else:
            # The cache's part: what cache_unfinished_req left it, else the matched prefix.
            cached = _field(req, "_cpcache_cached")
            tail = row[len(req.prefix_indices) if cached is None else cached:n]
        self._free(tail[tail >= 0])
        self.dec_lock_ref(_field(req, "last_node"))

    def evict(self, num_tokens=0):
        """Evicts at least num_tokens tokens' pages from L1 (an int or SGLang's EvictParams)
        [R: the same num_tokens on every rank]; their locations go to the allocator."""
        n = _field(num_tokens, "num_tokens", num_tokens)
        ev = self.cache.evict_locs(int(n), out=self.tensors)
        self._free(ev.freed)
        return EvictResult(ev.freed_tokens)

    def make_room(self, end, start=0):
        """The agreed cross-rank eviction before allocating a request's locations for its
        tokens [start, end) (start: its device hit) [R]; freed locations go to the
        allocator. False when the cache cannot make room (locked pages, backups in flight:
        step and retry)."""
        reserved = self.reserved() if self.reserved is not None else None
        r = self.cache.make_room(end, start, reserved=reserved, out=self.tensors)
        self._free(r.freed)
        return r.room

    def init_load_back(self, last_node=None, host_hit_length=None, mem_quota=None, **kwargs):
        """Loads node's host hit (host_hit_length tokens beyond the device hit) back into
        locations from the allocator [R]; accepts SGLang's InitLoadBackParams too. Returns
        (device_indices of the loading tokens: this rank's locations, -1 for other ranks',
        node); empty when nothing loads (no room, over mem_quota, nothing planned). The copies
        start at the next step (ready_to_load_host_cache); the node stays locked until
        loading_check sees them over."""
        params = last_node
        if host_hit_length is None and params is not None and hasattr(params, "host_hit_length"):
            last_node = _field(params, "best_match_node", None) or _field(params, "last_host_node")
            host_hit_length, mem_quota = params.host_hit_length, _field(params, "mem_quota")
        node = last_node
        if not host_hit_length or host_hit_length <= 0 or (mem_quota is not None and host_hit_length > mem_quota):
            return self._empty(), node
        dt, _ = self._depth.get(node, (0, 0))
        if not self.make_room(dt + host_hit_length, dt):
            return self._empty(), node
        plan = self.cache.load_back_plan(node)
        pt = self.page_size
        want = len(plan) * pt
        locs = self.token_to_kv_pool_allocator.alloc(want) if want else self._empty()
        if locs is None:
            # make_room said every rank has room: an allocator without it holds locations the
            # reserved hook did not count. Not a replicated outcome: the group cannot go on.
            raise cpcache.L1FullError(-8, f"cpcache.sglang: the allocator has no {want} locations for a load-back "
                                          "after make_room (does the reserved hook count every running request?)")
        try:
            res = self.cache.load_back_locs(node, locs, out=self.tensors)
        except cpcache.Error:
            self._free(locs)
            raise
        self._free(res.freed)
        if res.pages == 0:
            return self._empty(), node
        np = cpcache._numpy()
        out = np.full(res.tokens, -1, dtype=np.int64)
        host_locs = _host(locs)
        first = dt // pt
        for k, page in enumerate(plan):
            pos = (page - first) * pt
            if pos + pt <= res.tokens:
                out[pos:pos + pt] = host_locs[k * pt:(k + 1) * pt]
        self.inc_lock_ref(node)
        self._loading.append(node)
        self._new_loads.append(node)
        if self.tensors == "torch":
            out = _torch().from_numpy(out)
        return out, node

    def ready_to_load_host_cache(self):
        """Starts the loads init_load_back asked for: a step when there are any [R]. Returns
        the consumer index (a counter) of this load batch."""
        if self._new_loads:
            self._waiting, self._new_loads = self._new_loads, []
            self._step()
        self._consumer += 1
        return self._consumer

    def wait_layer(self, layer, timeout_ms=-1):
        """Waits until layer `layer` of the loads the last ready_to_load_host_cache started
        landed in this rank's L1 [L]: in the forward, before that layer's attention."""
        for node in self._waiting:
            self.cache.wait_l1_layer(node, layer, timeout_ms)

    def _step(self):
        self.cache.step()
        self._free(self.cache.take_freed_locs(out=self.tensors))

    def check_hicache_events(self):
        """The per-step sync: Cache.step() [R] (once per scheduler step on every rank), the
        locations the cache let go at it to the allocator, and loading_check()."""
        self._step()
        self.loading_check()

    def loading_check(self):
        """Unlocks the nodes whose loads the group agreed are over [R]. Returns whether any is
        still loading."""
        still = []
        for node in self._loading:
            if self.cache.load_pending(node):
                still.append(node)
            else:
                self.dec_lock_ref(node)
        self._loading = still
        return bool(still)

    def protected_size(self):
        """Tokens of the locked nodes' prefixes (a prefix shared by two locked nodes counts
        twice: an upper bound) [L]."""
        return sum(t for _, t in self._locks.values())

    def total_size(self):
        """This rank's tokens in L1 (the pages the cache holds on it) [L]."""
        return self.cache.l1_used_by(self.cache.info.cp_rank) * self.page_size

    def evictable_size(self):
        """total_size() less protected_size() (at least 0) [L]."""
        return max(0, self.total_size() - self.protected_size())

    def reset(self):
        """Empties the cache [R, collective]: steps until no transfer is in flight, flushes,
        and gives every location the cache held back to the allocator. Locks are dropped."""
        while self.cache.pending():
            self._step()
        self.cache.flush()
        self._free(self.cache.take_freed_locs(out=self.tensors))
        self._locks.clear()
        self._depth.clear()
        self._loading, self._new_loads, self._waiting = [], [], []

    def is_chunk_cache(self):
        return False

    def is_tree_cache(self):
        return True

    def supports_swa(self):
        return False

    def supports_mamba(self):
        return False
