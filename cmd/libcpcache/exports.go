package main

/*
#include "../../csrc/cpcache_capi.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/internal/version"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/zmq"
)

// The Go names of the header's kinds must equal its macros: a difference makes one of these
// constants negative, which does not compile as a uint.
const (
	_ = uint(C.CPCACHE_L1_ALLOC-l1Alloc) + uint(l1Alloc-C.CPCACHE_L1_ALLOC)
	_ = uint(C.CPCACHE_L1_HOST-l1Host) + uint(l1Host-C.CPCACHE_L1_HOST)
	_ = uint(C.CPCACHE_L1_DEVICE-l1Device) + uint(l1Device-C.CPCACHE_L1_DEVICE)
	_ = uint(C.CPCACHE_SLAB_HOST-slabHost) + uint(slabHost-C.CPCACHE_SLAB_HOST)
	_ = uint(C.CPCACHE_SLAB_CUDA_IPC-slabCUDAIPC) + uint(slabCUDAIPC-C.CPCACHE_SLAB_CUDA_IPC)
	_ = uint(C.CPCACHE_POLICY_WRITE_BACK-int(hicache.WriteBack)) + uint(int(hicache.WriteBack)-C.CPCACHE_POLICY_WRITE_BACK)
	_ = uint(C.CPCACHE_L1_CACHE_OWNED-int(hicache.CacheOwned)) + uint(int(hicache.CacheOwned)-C.CPCACHE_L1_CACHE_OWNED)
	_ = uint(C.CPCACHE_L1_ENGINE_OWNED-int(hicache.EngineOwned)) + uint(int(hicache.EngineOwned)-C.CPCACHE_L1_ENGINE_OWNED)
)

// The exported functions: cpcapi_<name> backs the header's cpcache_<name>, which
// csrc/cpcache_capi.c defines in C (the list: csrc/cpcache_entries.h) so that a process
// forked after the library was loaded gets CPCACHE_ERR_FORKED without entering Go. Each
// checks its pointers and sizes, recovers panics (guard), and turns errors into status codes
// with a thread-local message (fail). Documentation of each is in include/cpcache.h.

// versionString is cpcache_version()'s answer, allocated once and never freed (the header
// promises static storage).
var versionString = C.CString(version.String())

// init hands the version to the C side, which answers cpcache_version from it in a forked
// child.
func init() { C.cpcapi_set_version(versionString) }

// cpcapi_version backs cpcache_version (csrc/cpcache_capi.c), which C may call before the
// Go runtime has started: a call into an exported function waits for it.
//
//export cpcapi_version
func cpcapi_version() *C.char { return versionString }

//export cpcapi_config_init
func cpcapi_config_init(cfg *C.cpcache_config) (status C.int) {
	defer guard(&status)
	if cfg == nil {
		return fail(fmt.Errorf("%w: cpcache_config_init: cfg is NULL", errInvalid))
	}
	*cfg = C.cpcache_config{
		struct_size: C.sizeof_cpcache_config, abi_version: C.CPCACHE_ABI_VERSION,
		dp_attention: 1, rank: -1, timeout_ms: C.int64_t(60_000), page_tokens: 16,
		slab_backend: C.CPCACHE_SLAB_HOST, l1_kind: C.CPCACHE_L1_ALLOC, policy: C.CPCACHE_POLICY_WRITE_THROUGH,
	}
	return C.CPCACHE_OK
}

//export cpcapi_open
func cpcapi_open(cfg *C.cpcache_config, out *C.cpcache_t) (status C.int) {
	defer guard(&status)
	if cfg == nil || out == nil {
		return fail(fmt.Errorf("%w: cpcache_open: cfg (%p) and out (%p) must not be NULL", errInvalid, cfg, out))
	}
	cfg, err := currentConfig(cfg)
	if err != nil {
		return fail(err)
	}
	// Variables set since the process started (Python's os.environ, putenv) count.
	syncEnviron()
	gc := goConfig(cfg)
	if cfg.store != nil {
		if gc.rendezvous, err = newCallbackStore(cfg.store); err != nil {
			return fail(fmt.Errorf("cpcache_open: %w", err))
		}
	}
	h, err := openHandle(gc)
	if err != nil {
		return fail(fmt.Errorf("cpcache_open: %w", err))
	}
	*out = C.cpcache_t(h)
	return C.CPCACHE_OK
}

// configSizeV1 is sizeof(cpcache_config) in an ABI-1 header: the fields before kv_layout.
const configSizeV1 = C.uint32_t(unsafe.Offsetof(C.cpcache_config{}.kv_layout))

// configSizeV2 is sizeof(cpcache_config) in an ABI-2 header: the fields before store.
const configSizeV2 = C.uint32_t(unsafe.Offsetof(C.cpcache_config{}.store))

// currentConfig is cfg as this header's cpcache_config: itself when it is one (struct_size
// and abi_version of this header), or a copy of an older caller's config (struct_size
// configSizeV1 with abi_version 1, or configSizeV2 with 2) whose newer fields take their
// defaults (zero: opaque pages, the pool of l1_kind, page_first, cache-owned L1 slots; no
// store callbacks, job id or local world). Any other pair is errSize naming both.
func currentConfig(cfg *C.cpcache_config) (*C.cpcache_config, error) {
	older := func(size C.uint32_t) *C.cpcache_config {
		// Only the old struct's bytes are the caller's: copy them into a zeroed current config.
		up := new(C.cpcache_config)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(up)), size), unsafe.Slice((*byte)(unsafe.Pointer(cfg)), size))
		up.struct_size, up.abi_version = C.sizeof_cpcache_config, C.CPCACHE_ABI_VERSION
		return up
	}
	switch {
	case cfg.struct_size == C.sizeof_cpcache_config && cfg.abi_version == C.CPCACHE_ABI_VERSION:
		return cfg, nil
	case cfg.struct_size == configSizeV1 && cfg.abi_version == 1:
		return older(configSizeV1), nil
	case cfg.struct_size == configSizeV2 && cfg.abi_version == 2:
		return older(configSizeV2), nil
	}
	return nil, fmt.Errorf("%w: cpcache_open: config struct_size %d, abi_version %d; this library takes %d with abi_version %d, an ABI-2 config (%d, 2) or an ABI-1 config (%d, 1) (call cpcache_config_init; rebuild against this cpcache.h)",
		errSize, cfg.struct_size, cfg.abi_version, C.sizeof_cpcache_config, C.CPCACHE_ABI_VERSION, configSizeV2, configSizeV1)
}

// goConfig copies a C configuration into Go values (checkConfig judges them).
func goConfig(cfg *C.cpcache_config) *openConfig {
	var timeout time.Duration // not positive, and so rejected, when out of range
	if cfg.timeout_ms > 0 && cfg.timeout_ms <= C.int64_t(maxTimeoutMs) {
		timeout = time.Duration(cfg.timeout_ms) * time.Millisecond
	}
	str := func(p *C.char) string {
		if p == nil {
			return ""
		}
		return C.GoString(p)
	}
	return &openConfig{
		layout: parallel.LayoutConfig{World: int(cfg.world), TP: int(cfg.tp), DP: int(cfg.dp), AttnCP: int(cfg.attn_cp),
			EP: int(cfg.ep), DPAttention: cfg.dp_attention != 0},
		rank: int(cfg.rank), store: str(cfg.store_url), consensus: str(cfg.consensus),
		timeout: timeout, timeoutMs: int64(cfg.timeout_ms),
		pageTokens: int(cfg.page_tokens), pageBytes: int(cfg.page_bytes),
		slabKind: int(cfg.slab_backend), device: int(cfg.device), pinHost: cfg.pin_host != 0, l2Pages: int(cfg.l2_pages),
		l1Kind: int(cfg.l1_kind), l1Base: cfg.l1_base, l1Pages: int(cfg.l1_pages),
		options: hicache.Options{
			Policy: hicache.Policy(cfg.policy), WriteThreshold: int(cfg.write_threshold),
			MinLoadPages: int(cfg.min_load_pages), LoadQuotaPages: int(cfg.load_quota_pages),
			L1Mode: hicache.L1Mode(uint8(cfg.l1_mode)),
		},
		l1ModeIn:   int(cfg.l1_mode),
		storageURL: str(cfg.storage_url), model: str(cfg.model),
		kv:    goKVConfig(cfg, str),
		jobID: str(cfg.job_id), localWorld: int(cfg.local_world),
		kvEvents: kvevents.Config{Endpoint: str(cfg.kv_events_endpoint), ReplayEndpoint: str(cfg.kv_events_replay_endpoint),
			Topic: str(cfg.kv_events_topic)},
		metricsAddr: str(cfg.metrics_addr),
	}
}

// goKVConfig copies the ABI-2 fields of cfg (resolveKV judges them). A negative count or
// one with a NULL array is kept as a marker resolveKV rejects.
func goKVConfig(cfg *C.cpcache_config, str func(*C.char) string) kvConfig {
	k := kvConfig{kvSpec: str(cfg.kv_layout), kvLayers: int(cfg.kv_num_layers), l2LayoutIn: int(cfg.l2_layout)}
	if cfg.kv_parts != nil && cfg.kv_num_parts > 0 {
		for _, p := range unsafe.Slice(cfg.kv_parts, int(cfg.kv_num_parts)) {
			k.kvParts = append(k.kvParts, kvPartDesc{name: str(p.name), bytesPerToken: int64(p.bytes_per_token), sharding: int32(p.sharding), reserved: int32(p.reserved)})
		}
	}
	if cfg.l1_buffers != nil && cfg.l1_num_buffers > 0 {
		for _, b := range unsafe.Slice(cfg.l1_buffers, int(cfg.l1_num_buffers)) {
			k.l1Buffers = append(k.l1Buffers, l1BufferDesc{layer: int32(b.layer), part: int32(b.part), kind: int32(b.kind), tokenBytes: int32(b.token_bytes),
				base: b.base, bytes: int64(b.bytes), pageStride: int64(b.page_stride), tokenStride: int64(b.token_stride)})
		}
	}
	k.badCounts = cfg.kv_num_parts < 0 || cfg.l1_num_buffers < 0 ||
		(cfg.kv_num_parts > 0 && cfg.kv_parts == nil) || (cfg.l1_num_buffers > 0 && cfg.l1_buffers == nil)
	return k
}

//export cpcapi_kv_bytes_per_token
func cpcapi_kv_bytes_per_token(c C.cpcache_t, out *C.int64_t) (status C.int) {
	defer guard(&status)
	return kvSize(c, out, "cpcache_kv_bytes_per_token", func(i *sessionInfo) int64 { return i.kvBytesPerToken })
}

//export cpcapi_kv_page_bytes
func cpcapi_kv_page_bytes(c C.cpcache_t, out *C.int64_t) (status C.int) {
	defer guard(&status)
	return kvSize(c, out, "cpcache_kv_page_bytes", func(i *sessionInfo) int64 { return i.kvPageBytes })
}

// kvSize writes one of the session's KV sizes (field) to out: CPCACHE_ERR_INVALID without a
// KV layout or with a NULL out.
func kvSize(c C.cpcache_t, out *C.int64_t, fn string, field func(*sessionInfo) int64) C.int {
	if out == nil {
		return fail(fmt.Errorf("%w: %s: out is NULL", errInvalid, fn))
	}
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	defer s.mu.Unlock()
	v := field(&s.info)
	if v == 0 {
		return fail(fmt.Errorf("%w: %s: the cache has no KV layout (cpcache_config.kv_layout, kv_parts)", errInvalid, fn))
	}
	*out = C.int64_t(v)
	return C.CPCACHE_OK
}

//export cpcapi_close
func cpcapi_close(c C.cpcache_t) (status C.int) {
	defer guard(&status)
	return result(closeHandle(uint64(c)))
}

//export cpcapi_abort
func cpcapi_abort(c C.cpcache_t) (status C.int) {
	defer guard(&status)
	return result(abortHandle(uint64(c)))
}

//export cpcapi_get_info
func cpcapi_get_info(c C.cpcache_t, info *C.cpcache_info) (status C.int) {
	defer guard(&status)
	if info == nil {
		return fail(fmt.Errorf("%w: cpcache_get_info: info is NULL", errInvalid))
	}
	if info.struct_size != C.sizeof_cpcache_info {
		return fail(fmt.Errorf("%w: cpcache_info: struct_size %d, want %d", errSize, info.struct_size, C.sizeof_cpcache_info))
	}
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	defer s.mu.Unlock()
	in := s.info
	name := C.CPCAPI_NAME_GLOO
	if in.consensus == "shm" {
		name = C.CPCAPI_NAME_SHM
	}
	*info = C.cpcache_info{
		struct_size: C.sizeof_cpcache_info,
		rank:        C.int32_t(in.rank), world: C.int32_t(in.world), cp_rank: C.int32_t(in.cpRank), cp_size: C.int32_t(in.cpSize),
		tp_rank: C.int32_t(in.tpRank), dp_rank: C.int32_t(in.dpRank), replica_size: C.int32_t(in.replicaSize),
		page_tokens: C.int32_t(in.pageTokens), page_bytes: C.int64_t(in.pageBytes),
		l1_pages: C.int64_t(in.l1Pages), l2_pages: C.int64_t(in.l2Pages),
		l1_base: s.l1Base, consensus: C.cpcapi_static_name(C.int(name)),
	}
	return C.CPCACHE_OK
}

// pagedArgs checks what match and insert share: the tokens, a non-NULL out, and a buffer
// (buf, bufCap) for up to one entry per whole page of the tokens; NULL with capacity 0 is
// accepted when nullOK, or when the tokens hold no whole page.
func (s *session) pagedArgs(fn string, tokens *C.int32_t, n C.size_t, outNil bool, buf unsafe.Pointer, bufCap C.size_t, what string, nullOK bool) ([]int32, error) {
	toks, err := tokenSlice(unsafe.Pointer(tokens), uint64(n), "tokens")
	if err == nil && outNil {
		err = fmt.Errorf("%w: %s: out is NULL", errInvalid, fn)
	}
	pages := len(toks) / s.info.pageTokens
	if err == nil {
		err = needCap(buf, uint64(bufCap), pages, what, nullOK || pages == 0)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fn, err)
	}
	return toks, nil
}

//export cpcapi_match
func cpcapi_match(c C.cpcache_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_match_result, slots *C.int32_t, slotsCap C.size_t) (status C.int) {
	defer guard(&status)
	return matchKey("cpcache_match", c, nil, 0, tokens, n, out, slots, slotsCap)
}

//export cpcapi_match_key
func cpcapi_match_key(c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_match_result, slots *C.int32_t, slotsCap C.size_t) (status C.int) {
	defer guard(&status)
	return matchKey("cpcache_match_key", c, key, keyLen, tokens, n, out, slots, slotsCap)
}

func matchKey(fn string, c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_match_result, slots *C.int32_t, slotsCap C.size_t) C.int {
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	defer s.mu.Unlock()
	k, err := keyString(key, uint64(keyLen))
	if err != nil {
		return fail(fmt.Errorf("%s: %w", fn, err))
	}
	toks, err := s.pagedArgs(fn, tokens, n, out == nil, unsafe.Pointer(slots), slotsCap, "l1_slots", true)
	if err != nil {
		return fail(err)
	}
	// Match does not keep tokens: the C memory is read in place.
	m, err := s.cache.Match(hicache.Request{Tokens: toks, Key: k})
	if err != nil {
		return fail(err)
	}
	if uint64(len(m.L1Slots)) > uint64(slotsCap) && slots != nil {
		return fail(fmt.Errorf("%w: %s: %d slots for l1_slots of %d", errInternal, fn, len(m.L1Slots), slotsCap))
	}
	if slots != nil && len(m.L1Slots) > 0 {
		// The C buffer is viewed only as long as what is written: slots_cap is a bound
		// (pagedArgs checked it holds them all), and SIZE_MAX is past any Go slice.
		copy(unsafe.Slice((*int32)(unsafe.Pointer(slots)), len(m.L1Slots)), m.L1Slots)
	}
	*out = C.cpcache_match_result{node: C.cpcache_node_t(m.Last), device_pages: C.int64_t(m.DevicePages), host_pages: C.int64_t(m.HostPages)}
	return C.CPCACHE_OK
}

// nodeCall runs f on the node named by h under the session's lock (sessionCall). A C node
// handle is the cache's own (hicache.Handle), checked by every call taking it: one that
// names no node (0, evicted, from before a flush or a recovery, from a closed cache) is
// CPCACHE_ERR_NODE (see statusOf).
func nodeCall(c C.cpcache_t, h C.cpcache_node_t, what string, f func(*session, hicache.Handle) error) C.int {
	return sessionCall(c, what, func(s *session) error {
		n, err := s.node(h)
		if err != nil {
			return err
		}
		return f(s, n)
	})
}

// node is h as the cache's handle. The cache takes the root's handle (the empty prefix) of
// any of its generations for the current root's, so that a Go scheduler's lock on it
// outlives a flush; to C, every handle from before a flush or a recovery is stale, the
// root's too.
func (s *session) node(h C.cpcache_node_t) (hicache.Handle, error) {
	if gen := uint64(h) >> hicache.HandleIDBits; h != 0 && gen != s.cache.Generation() {
		return 0, &hicache.StaleHandleError{Handle: hicache.Handle(h), Why: "from before a flush or a recovery, or from a closed cache"}
	}
	return hicache.Handle(h), nil
}

//export cpcapi_lock
func cpcapi_lock(c C.cpcache_t, node C.cpcache_node_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_lock", func(s *session, n hicache.Handle) error { return s.cache.Lock(n) })
}

//export cpcapi_unlock
func cpcapi_unlock(c C.cpcache_t, node C.cpcache_node_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_unlock", func(s *session, n hicache.Handle) error { return s.cache.Unlock(n) })
}

//export cpcapi_load_back
func cpcapi_load_back(c C.cpcache_t, node C.cpcache_node_t, pages *C.int64_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_load_back", func(s *session, n hicache.Handle) error {
		res, err := s.cache.LoadBack(n)
		if err == nil && pages != nil {
			*pages = C.int64_t(res.Pages)
		}
		return err
	})
}

//export cpcapi_load_pending
func cpcapi_load_pending(c C.cpcache_t, node C.cpcache_node_t, pending *C.int32_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_load_pending", func(s *session, n hicache.Handle) error {
		if pending == nil {
			return fmt.Errorf("%w: pending is NULL", errInvalid)
		}
		*pending = 0
		if s.cache.LoadPending(n) {
			*pending = 1
		}
		return nil
	})
}

//export cpcapi_wait_l1
func cpcapi_wait_l1(c C.cpcache_t, node C.cpcache_node_t, timeoutMs C.int64_t) (status C.int) {
	defer guard(&status)
	return waitCall(c, node, "cpcache_wait_l1", timeoutMs, func(ctx context.Context, cache *hicache.Cache, h hicache.Handle) error {
		return cache.WaitL1(ctx, h)
	})
}

//export cpcapi_wait_l1_layer
func cpcapi_wait_l1_layer(c C.cpcache_t, node C.cpcache_node_t, layer C.int32_t, timeoutMs C.int64_t) (status C.int) {
	defer guard(&status)
	return waitCall(c, node, "cpcache_wait_l1_layer", timeoutMs, func(ctx context.Context, cache *hicache.Cache, h hicache.Handle) error {
		return cache.WaitL1Layer(ctx, h, int(layer))
	})
}

// waitCall runs f, a local wait on node's loads bounded by timeoutMs (see waitLimit), without
// the session's lock: the wait may be long, and the scheduler thread needs the session
// meanwhile.
func waitCall(c C.cpcache_t, node C.cpcache_node_t, what string, timeoutMs C.int64_t, f func(context.Context, *hicache.Cache, hicache.Handle) error) C.int {
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	h, err := s.node(node)
	cache := s.cache
	s.mu.Unlock()
	if err != nil {
		return fail(fmt.Errorf("%s: %w", what, err))
	}
	ctx := context.Background()
	if limit, ok := waitLimit(int64(timeoutMs)); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	return result(f(ctx, cache, h))
}

//export cpcapi_wait_l1_layer_on
func cpcapi_wait_l1_layer_on(c C.cpcache_t, node C.cpcache_node_t, layer C.int32_t, stream unsafe.Pointer) (status C.int) {
	defer guard(&status)
	// It does not block (the stream waits, not the caller), so it may hold the session.
	return nodeCall(c, node, "cpcache_wait_l1_layer_on", func(s *session, n hicache.Handle) error {
		return s.cache.WaitL1LayerOn(n, int(layer), uintptr(stream))
	})
}

//export cpcapi_insert
func cpcapi_insert(c C.cpcache_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_insert_result, fill *C.cpcache_fill_page, fillCap C.size_t) (status C.int) {
	defer guard(&status)
	return insertKey("cpcache_insert", c, nil, 0, tokens, n, out, fill, fillCap)
}

//export cpcapi_insert_key
func cpcapi_insert_key(c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_insert_result, fill *C.cpcache_fill_page, fillCap C.size_t) (status C.int) {
	defer guard(&status)
	return insertKey("cpcache_insert_key", c, key, keyLen, tokens, n, out, fill, fillCap)
}

func insertKey(fn string, c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_insert_result, fill *C.cpcache_fill_page, fillCap C.size_t) C.int {
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	defer s.mu.Unlock()
	k, err := keyString(key, uint64(keyLen))
	if err != nil {
		return fail(fmt.Errorf("%s: %w", fn, err))
	}
	toks, err := s.pagedArgs(fn, tokens, n, out == nil, unsafe.Pointer(fill), fillCap, "fill", false)
	if err != nil {
		return fail(err)
	}
	// The tree keeps the tokens of new nodes: they must live in Go memory.
	res, err := s.cache.Insert(hicache.Request{Tokens: append([]int32(nil), toks...), Key: k})
	if err != nil {
		return fail(fmt.Errorf("%s: %w", fn, err))
	}
	if uint64(len(res.Fill)) > uint64(fillCap) {
		return fail(fmt.Errorf("%w: %s: %d fill pages for fill of %d", errInternal, fn, len(res.Fill), fillCap))
	}
	if len(res.Fill) > 0 {
		dst := unsafe.Slice(fill, len(res.Fill)) // fill_cap is a bound (pagedArgs), as in cpcache_match
		for i, p := range res.Fill {
			owned := C.int32_t(0)
			if p.Owner == s.info.cpRank {
				owned = 1
			}
			dst[i] = C.cpcache_fill_page{slot: C.int32_t(p.Slot), owner: C.int32_t(p.Owner), index: C.int64_t(p.Index), hash: C.uint64_t(p.Hash.Index()), owned: owned}
		}
	}
	*out = C.cpcache_insert_result{node: C.cpcache_node_t(res.Last), pages: C.int64_t(res.Pages), n_fill: C.int64_t(len(res.Fill)), backups: C.int64_t(res.Backups)}
	return C.CPCACHE_OK
}

// sessionCall runs f under the session's lock.
func sessionCall(c C.cpcache_t, what string, f func(*session) error) C.int {
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	defer s.mu.Unlock()
	if err := f(s); err != nil {
		return fail(fmt.Errorf("%s: %w", what, err))
	}
	return C.CPCACHE_OK
}

func nonNegative(v C.int64_t, what string) error {
	if v < 0 {
		return fmt.Errorf("%w: %s %d is negative", errInvalid, what, v)
	}
	return nil
}

//export cpcapi_evict_l1
func cpcapi_evict_l1(c C.cpcache_t, pages C.int64_t, freed *C.int64_t) (status C.int) {
	defer guard(&status)
	return evictL1(c, "cpcache_evict_l1", pages, freed, nil)
}

//export cpcapi_evict_l1_ex
func cpcapi_evict_l1_ex(c C.cpcache_t, pages C.int64_t, freed, pending *C.int64_t) (status C.int) {
	defer guard(&status)
	return evictL1(c, "cpcache_evict_l1_ex", pages, freed, pending)
}

// evictL1 is cpcache_evict_l1 and cpcache_evict_l1_ex: freed and pending may be NULL.
func evictL1(c C.cpcache_t, what string, pages C.int64_t, freed, pending *C.int64_t) C.int {
	return sessionCall(c, what, func(s *session) error {
		if err := nonNegative(pages, "pages"); err != nil {
			return err
		}
		f, p, err := s.cache.EvictL1(int(pages))
		if err != nil {
			return err
		}
		if freed != nil {
			*freed = C.int64_t(f)
		}
		if pending != nil {
			*pending = C.int64_t(p)
		}
		return nil
	})
}

//export cpcapi_evict_l2
func cpcapi_evict_l2(c C.cpcache_t, pages C.int64_t, freed *C.int64_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_evict_l2", func(s *session) error {
		if err := nonNegative(pages, "pages"); err != nil {
			return err
		}
		f, err := s.cache.EvictL2(int(pages))
		if err == nil && freed != nil {
			*freed = C.int64_t(f)
		}
		return err
	})
}

//export cpcapi_step
func cpcapi_step(c C.cpcache_t) (status C.int) {
	defer guard(&status)
	return collectiveCall(c, "cpcache_step", func(s *session) error { return s.cache.Step(s.ctx) })
}

// collectiveCall runs f — a call with a collective, which may wait for peers — without the
// session's lock, so that local calls (cpcache_wait_l1, cpcache_get_stats) answer meanwhile
// as the cache allows.
func collectiveCall(c C.cpcache_t, what string, f func(*session) error) C.int {
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	s.collectives.Add(1)
	s.mu.Unlock()
	err = f(s)
	s.collectives.Add(-1)
	if err != nil && s.ctx.Err() != nil {
		return fail(fmt.Errorf("%s: %w: the cache was aborted (cpcache_abort) while this call waited for its peers: %v", what, errClosed, err))
	}
	if err != nil {
		return fail(fmt.Errorf("%s: %w", what, err))
	}
	return C.CPCACHE_OK
}

//export cpcapi_pending
func cpcapi_pending(c C.cpcache_t, pending *C.int64_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_pending", func(s *session) error {
		if pending == nil {
			return fmt.Errorf("%w: pending is NULL", errInvalid)
		}
		*pending = C.int64_t(s.cache.Pending())
		return nil
	})
}

//export cpcapi_flush
func cpcapi_flush(c C.cpcache_t) (status C.int) {
	defer guard(&status)
	return collectiveCall(c, "cpcache_flush", func(s *session) error { return s.cache.Flush(s.ctx) })
}

//export cpcapi_prefetch
func cpcapi_prefetch(c C.cpcache_t, tokens *C.int32_t, n C.size_t, id *C.uint64_t) (status C.int) {
	defer guard(&status)
	return prefetchKey("cpcache_prefetch", c, nil, 0, tokens, n, id)
}

//export cpcapi_prefetch_key
func cpcapi_prefetch_key(c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, id *C.uint64_t) (status C.int) {
	defer guard(&status)
	return prefetchKey("cpcache_prefetch_key", c, key, keyLen, tokens, n, id)
}

func prefetchKey(fn string, c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, id *C.uint64_t) C.int {
	return sessionCall(c, fn, func(s *session) error {
		req, err := requestArg(key, keyLen, tokens, n)
		if err != nil {
			return err
		}
		if id == nil {
			return fmt.Errorf("%w: id is NULL", errInvalid)
		}
		res, err := s.cache.Prefetch(hicache.Request{Tokens: append([]int32(nil), req.Tokens...), Key: req.Key})
		if err == nil {
			*id = C.uint64_t(res.ID)
		}
		return err
	})
}

//export cpcapi_prefetch_pending
func cpcapi_prefetch_pending(c C.cpcache_t, id C.uint64_t, pending *C.int32_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_prefetch_pending", func(s *session) error {
		if pending == nil {
			return fmt.Errorf("%w: pending is NULL", errInvalid)
		}
		*pending = 0
		if s.cache.PrefetchPending(uint64(id)) {
			*pending = 1
		}
		return nil
	})
}

//export cpcapi_prefetch_revoke
func cpcapi_prefetch_revoke(c C.cpcache_t, id C.uint64_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_prefetch_revoke", func(s *session) error { return s.cache.RevokePrefetch(uint64(id)) })
}

//export cpcapi_l1_page
func cpcapi_l1_page(c C.cpcache_t, slot C.int32_t, page *unsafe.Pointer, size *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_l1_page", func(s *session) error {
		switch {
		case page == nil || size == nil:
			return fmt.Errorf("%w: page (%p) and len (%p) must not be NULL", errInvalid, page, size)
		case s.l1Buffers:
			return fmt.Errorf("%w: no L1 pool: the L1 is the engine's per-layer l1_buffers (a page is a chunk in each)", errInvalid)
		case s.l1Base == nil:
			return fmt.Errorf("%w: the L1 pool is device memory (no host address)", errInvalid)
		case slot < 0 || int(slot) >= s.info.l1Pages:
			return fmt.Errorf("%w: L1 slot %d outside 0..%d", errRange, slot, s.info.l1Pages-1)
		}
		*page = unsafe.Add(s.l1Base, int(slot)*s.info.pageBytes)
		*size = C.size_t(s.info.pageBytes)
		return nil
	})
}

// statsSizeV1 is the size of cpcache_stats before no_step_warnings was appended.
const statsSizeV1 = unsafe.Offsetof(C.cpcache_stats{}.no_step_warnings)

//export cpcapi_get_stats
func cpcapi_get_stats(c C.cpcache_t, out *C.cpcache_stats) (status C.int) {
	defer guard(&status)
	if out == nil {
		return fail(fmt.Errorf("%w: cpcache_get_stats: stats is NULL", errInvalid))
	}
	size := uintptr(out.struct_size)
	if size != C.sizeof_cpcache_stats && size != statsSizeV1 {
		return fail(fmt.Errorf("%w: cpcache_get_stats: struct_size %d, want %d (or %d, the struct without no_step_warnings)",
			errSize, out.struct_size, C.sizeof_cpcache_stats, statsSizeV1))
	}
	return sessionCall(c, "cpcache_get_stats", func(s *session) error {
		st := s.cache.Stats()
		med, p99 := latencyQuantiles(st.ConsensusLatency)
		l2 := C.int64_t(1) // l2_enabled: the header's field, the negation of quarantined
		if st.Quarantined {
			l2 = 0
		}
		full := C.cpcache_stats{
			struct_size: C.uint32_t(size),
			matches:     C.int64_t(st.Matches), inserts: C.int64_t(st.Inserts),
			l1_hit_pages: C.int64_t(st.L1HitPages), l2_hit_pages: C.int64_t(st.L2HitPages), inserted_pages: C.int64_t(st.InsertedPages),
			written_pages: C.int64_t(st.WrittenPages), loaded_pages: C.int64_t(st.LoadedPages),
			evicted_l1_pages: C.int64_t(st.EvictedL1Pages), evicted_l2_pages: C.int64_t(st.EvictedL2Pages),
			steps: C.int64_t(st.Steps), digest_checks: C.int64_t(st.DigestChecks), digest_mismatches: C.int64_t(st.DigestMismatches),
			collectives:      C.int64_t(st.Collectives),
			pages_written_l2: C.int64_t(st.PagesWritten), pages_loaded_l2: C.int64_t(st.PagesLoaded),
			transfer_errors: C.int64_t(st.TransferErrors),
			l1_used:         C.int64_t(st.L1Used), l2_free_pages: C.int64_t(st.L2FreePages), nodes: C.int64_t(st.Nodes),
			pending: C.int64_t(s.cache.Pending()), l2_enabled: l2,
			consensus_latency_median_ns: C.int64_t(med), consensus_latency_p99_ns: C.int64_t(p99),
			storage_hit_pages: C.int64_t(st.L3HitPages), storage_prefetched_pages: C.int64_t(st.L3PrefetchedPages),
			storage_backed_up_pages: C.int64_t(st.L3BackedUpPages), storage_errors: C.int64_t(st.StorageErrors),
			no_step_warnings: C.int64_t(st.NoStepWarnings),
		}
		// An older caller's struct ends earlier: it gets the fields it has.
		copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), size), unsafe.Slice((*byte)(unsafe.Pointer(&full)), size))
		return nil
	})
}

//export cpcapi_metrics_text
func cpcapi_metrics_text(c C.cpcache_t, buf *C.char, capacity C.size_t, n *C.size_t) (status C.int) {
	defer guard(&status)
	if n == nil || buf == nil && capacity > 0 {
		return fail(fmt.Errorf("%w: cpcache_metrics_text: len (%p) must not be NULL, nor buf (%p) with cap %d", errInvalid, n, buf, capacity))
	}
	return sessionCall(c, "cpcache_metrics_text", func(s *session) error {
		text, err := s.metricsText()
		if err != nil {
			return err
		}
		*n = C.size_t(len(text))
		if uint64(capacity) < uint64(len(text))+1 {
			return fmt.Errorf("%w: buf of %d bytes, the text takes %d and its NUL", errSize, capacity, len(text))
		}
		out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(text)+1)
		copy(out, text)
		out[len(text)] = 0
		return nil
	})
}

// statusOf maps an error to its CPCACHE_ERR_* code: the ABI's own sentinels first, then the
// packages' typed errors. A start failure on the rank that failed is its own error's (the
// others get CPCACHE_ERR_PEER_LOST, from hicache.ErrPeerFailed).
func statusOf(err error) C.int {
	var start *hicache.StartError
	if errors.As(err, &start) && start.Err != nil && !errors.Is(start.Err, hicache.ErrPeerFailed) {
		err = start.Err
	}
	switch {
	case err == nil:
		return C.CPCACHE_OK
	case errors.Is(err, errInvalid):
		return C.CPCACHE_ERR_INVALID
	case errors.Is(err, errSize):
		return C.CPCACHE_ERR_SIZE
	case errors.Is(err, errRange):
		return C.CPCACHE_ERR_RANGE
	case errors.Is(err, errClosed), errors.Is(err, hicache.ErrClosed), errors.Is(err, parallel.ErrClosed):
		return C.CPCACHE_ERR_CLOSED
	case errors.Is(err, errAlreadyOpen):
		return C.CPCACHE_ERR_ALREADY_OPEN
	case errors.Is(err, hicache.ErrStaleHandle):
		return C.CPCACHE_ERR_NODE
	case errors.Is(err, hicache.ErrL1Full):
		return C.CPCACHE_ERR_L1_FULL
	case errors.Is(err, hicache.ErrNotStarted):
		return C.CPCACHE_ERR_NOT_STARTED
	case errors.Is(err, hicache.ErrBusy):
		return C.CPCACHE_ERR_BUSY
	case errors.Is(err, hicache.ErrPlacementDiverged):
		return C.CPCACHE_ERR_DIVERGED
	case errors.Is(err, parallel.ErrPeerLost):
		return C.CPCACHE_ERR_PEER_LOST
	case errors.Is(err, parallel.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return C.CPCACHE_ERR_TIMEOUT
	case errors.Is(err, hicache.ErrBadConfig), errors.Is(err, hicache.ErrScope),
		errors.Is(err, parallel.ErrBadLayout), errors.Is(err, parallel.ErrBadEnv),
		errors.Is(err, parallel.ErrBadArgument), errors.Is(err, parallel.ErrMismatch),
		errors.Is(err, slab.ErrBadArgument), errors.Is(err, slab.ErrSpecMismatch),
		errors.Is(err, slab.ErrUnsupported), errors.Is(err, hicache.ErrUnsupported), errors.Is(err, storage.ErrBadArgument),
		errors.Is(err, gloo.ErrStoreInUse), // the job's store (and job id) are another job's too
		// No CUDA driver (or one too old) for a configuration that needs it (a device L1 or
		// l1_buffers, CUDA IPC or pinned slabs): this machine cannot serve the configuration.
		errors.Is(err, cuda.ErrLibraryNotFound), errors.Is(err, cuda.ErrMissingSymbol),
		// No loadable libzmq (Debian's libzmq5) for kv_events_endpoint.
		errors.Is(err, zmq.ErrLibraryNotFound), errors.Is(err, zmq.ErrMissingSymbol):
		return C.CPCACHE_ERR_CONFIG
	case errors.Is(err, hicache.ErrPeerFailed):
		return C.CPCACHE_ERR_PEER_LOST
	case errors.Is(err, hicache.ErrBadArgument),
		// A value that does not fit the job, judged where the job starts (openSession
		// calls it CPCACHE_ERR_INVALID when it comes back alone, too).
		errors.Is(err, job.ErrBadValue):
		return C.CPCACHE_ERR_INVALID
	case errors.Is(err, errInternal):
		return C.CPCACHE_ERR_INTERNAL
	default:
		return C.CPCACHE_ERR_IO
	}
}

// fail records err as the calling thread's last error and returns its status. An exported
// function runs on the C caller's thread for its whole duration, so the thread-local buffer
// is the caller's.
func fail(err error) C.int {
	code := statusOf(err)
	msg := err.Error()
	return C.cpcapi_set_error(code, (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// result turns an error into a status (CPCACHE_OK for nil).
func result(err error) C.int {
	if err == nil {
		return C.CPCACHE_OK
	}
	return fail(err)
}

// guard turns a panic in an exported function into CPCACHE_ERR_INTERNAL with a one-line
// message (panicError): a bug in the library must not take the engine's process down, nor
// hand it a goroutine dump as an error message. Use as `defer guard(&status)`.
func guard(status *C.int) {
	if r := recover(); r != nil {
		*status = fail(panicError(r))
	}
}
