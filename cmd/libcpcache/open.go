package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/hostengine"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/internal/hostmem"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
)

// L1 pool kinds and slab backends (CPCACHE_L1_*, CPCACHE_SLAB_* in include/cpcache.h).
const (
	l1Alloc  = 0
	l1Host   = 1
	l1Device = 2

	slabHost    = 0
	slabCUDAIPC = 1
)

// openConfig is cpcache_config in Go terms, checked field by field (checkConfig) before any
// rank talks to another.
type openConfig struct {
	layout     parallel.LayoutConfig
	rank       int // -1: the launcher's environment
	store      string
	consensus  string
	timeout    time.Duration
	timeoutMs  int64 // timeout_ms as the caller gave it, for checkConfig's message (0: see timeout)
	pageTokens int
	pageBytes  int
	slabKind   int
	device     int
	pinHost    bool
	l2Pages    int
	l1Kind     int
	l1Base     unsafe.Pointer
	l1Pages    int
	options    hicache.Options
	l1ModeIn   int // l1_mode as given (options.L1Mode is its low byte)
	storageURL string
	model      string
	kv         kvConfig // ABI 2: KV layout, the engine's L1 buffers, L2 layout
	// ABI 3: the caller's store callbacks (nil: store), the job id, the ranks on this machine.
	rendezvous parallel.Store
	jobID      string
	localWorld int
	// ABI 3: KV events and the metrics address.
	kvEvents    kvevents.Config
	metricsAddr string
}

// storeArg names the store arguments of the C ABI in the error of a world without a store.
const storeArg = "cpcache_config.store_url (a URL), cpcache_config.store (callbacks) or CPCACHE_STORE"

// maxTimeoutMs is the largest timeout_ms a time.Duration holds (about 292 years).
const maxTimeoutMs = math.MaxInt64 / int64(time.Millisecond)

// checkConfig rejects values no rank could use, naming the field.
func checkConfig(c *openConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errInvalid}, args...)...)
	}
	if c.pageTokens > 0 {
		if err := resolveKV(c); err != nil {
			return err
		}
	}
	if err := checkEvents(c); err != nil {
		return err
	}
	switch {
	case c.layout.World < 0:
		return bad("world %d is negative", c.layout.World)
	case c.store != "" && c.rendezvous != nil:
		return bad("both cpcache_config.store_url (%q) and cpcache_config.store: give one", redact.URL(c.store))
	case c.localWorld < 0 || c.localWorld > 0 && (c.layout.World == 0 || c.localWorld > c.layout.World):
		return bad("local_world %d (want 0, or 1..world with an explicit world)", c.localWorld)
	case c.rank < -1:
		return bad("rank %d (want -1 for the launcher's, or 0..world-1)", c.rank)
	case c.rank >= 0 && c.layout.World == 0:
		return bad("explicit rank %d needs an explicit world size", c.rank)
	case c.rank >= c.layout.World && c.layout.World > 0:
		return bad("rank %d outside world size %d", c.rank, c.layout.World)
	case c.pageTokens <= 0:
		return bad("page_tokens %d must be positive", c.pageTokens)
	case c.pageBytes <= 0:
		return bad("page_bytes %d must be positive", c.pageBytes)
	case c.l1Pages <= 0 || c.l1Pages > math.MaxInt32:
		return bad("l1_pages %d must be in 1..2^31-1", c.l1Pages)
	case c.l2Pages <= 0 || c.l2Pages > math.MaxInt32:
		return bad("l2_pages %d must be in 1..2^31-1", c.l2Pages)
	case c.l1Pages > math.MaxInt64/c.pageBytes || c.l2Pages > math.MaxInt64/c.pageBytes:
		return bad("%d × %d bytes overflows", max(c.l1Pages, c.l2Pages), c.pageBytes)
	case c.slabKind != slabHost && c.slabKind != slabCUDAIPC:
		return bad("slab_backend %d (want CPCACHE_SLAB_HOST or CPCACHE_SLAB_CUDA_IPC)", c.slabKind)
	case c.l1Kind != l1Alloc && c.l1Kind != l1Host && c.l1Kind != l1Device:
		return bad("l1_kind %d (want CPCACHE_L1_ALLOC, _HOST or _DEVICE)", c.l1Kind)
	case c.l1Kind != l1Alloc && c.l1Base == nil && !c.kv.device:
		// (Device l1_buffers replace the device L1 pool: resolveKV wants l1_base NULL then.)
		return bad("l1_base is NULL with l1_kind %d", c.l1Kind)
	case c.l1Kind != l1Device && c.slabKind == slabCUDAIPC:
		return bad("CUDA IPC slabs need a device L1 (l1_kind CPCACHE_L1_DEVICE)")
	case c.device < 0 && (c.l1Kind == l1Device || c.slabKind == slabCUDAIPC || c.pinHost):
		return bad("device %d is negative (a CUDA device ordinal)", c.device)
	case c.l1Kind == l1Device && c.slabKind == slabHost && !c.pinHost:
		return bad("a device L1 with host slabs needs pin_host = 1 (copies reach the slabs through their registered device pointers)")
	case c.storageURL != "" && c.slabKind != slabHost:
		return bad("storage needs host slabs")
	case c.options.Policy < hicache.WriteThrough || c.options.Policy > hicache.WriteBack:
		return bad("policy %d", int(c.options.Policy))
	case c.l1ModeIn != int(hicache.CacheOwned) && c.l1ModeIn != int(hicache.EngineOwned):
		return bad("l1_mode %d (want CPCACHE_L1_CACHE_OWNED or CPCACHE_L1_ENGINE_OWNED)", c.l1ModeIn)
	case c.timeout <= 0:
		ms := c.timeoutMs
		if ms == 0 {
			ms = c.timeout.Milliseconds()
		}
		return bad("timeout_ms %d must be in 1..%d", ms, maxTimeoutMs)
	}
	return nil
}

// kvEventsFields name kvevents.Config's fields as cpcache_config does.
var kvEventsFields = map[string]string{
	kvevents.FieldEndpoint:       "kv_events_endpoint",
	kvevents.FieldReplayEndpoint: "kv_events_replay_endpoint",
}

// checkEvents rejects KV event endpoints no replica could publish on (kvevents.Config.Check,
// the last replica's numbering when the world is explicit) and a metrics_addr that is not
// host:port, naming the field and its value.
func checkEvents(c *openConfig) error {
	replicas := 1
	if c.layout.World > 0 {
		if layout, err := parallel.NewLayout(c.layout); err == nil {
			replicas = layout.AttnDP
		}
	}
	var ce *kvevents.ConfigError
	if err := c.kvEvents.Check(replicas); errors.As(err, &ce) {
		return fmt.Errorf("%w: %s %q: %v", errInvalid, kvEventsFields[ce.Field], ce.Value, ce.Err)
	} else if err != nil {
		return fmt.Errorf("%w: %w", errInvalid, err)
	}
	if c.metricsAddr != "" {
		if _, port, err := net.SplitHostPort(c.metricsAddr); err != nil || port == "" {
			return fmt.Errorf("%w: metrics_addr %q is not host:port (127.0.0.1:9400, :0)", errInvalid, c.metricsAddr)
		}
	}
	return nil
}

// session is the process's open cache and everything it owns, closed in reverse order.
type session struct {
	handle uint64     // set once before the session is published
	mu     sync.Mutex // protects closed; held through every call on the session
	closed bool
	cache  *hicache.Cache
	engine *hostengine.Engine // nil with a device L1
	l1Base unsafe.Pointer     // host L1 pool (nil with a device L1): memory outside the Go heap
	// l1Buffers: the L1 is the engine's per-layer buffers (cpcache_config.l1_buffers), no pool.
	l1Buffers bool
	info      sessionInfo
	closers   []func() error
	// ctx is the context of the session's collectives (cpcache_step, cpcache_flush);
	// cpcache_abort cancels it, so that a collective waiting for a late peer returns at once.
	ctx    context.Context
	cancel context.CancelFunc
	// collectives counts the collectives in flight (collectiveCall), which cpcache_abort
	// lets see the cancellation before it closes the session.
	collectives atomic.Int32
	// metricsText renders the rank's metrics (job.Rank.MetricsText).
	metricsText func() ([]byte, error)
	// freed are engine-owned L1 slots a call freed that did not fit the caller's buffer:
	// cpcache_take_freed_l1 hands them out before the cache's own drain.
	freed []int32
}

// sessionInfo is what cpcache_get_info reports.
type sessionInfo struct {
	rank, world, cpRank, cpSize, tpRank, dpRank, replicaSize int
	pageTokens, pageBytes, l1Pages, l2Pages                  int
	kvBytesPerToken, kvPageBytes                             int64 // 0: no KV layout
	consensus                                                string
}

// openSession joins the job and builds the cache (see cpcache_open) through job.Open. Its
// node-handle generations start above lastGen, this process's last one, and above every
// other rank's (agreed with the host-memory check), so that handles stay equal on every
// rank. On failure everything made so far is closed.
func openSession(ctx context.Context, c *openConfig, lastGen uint64) (_ *session, err error) {
	if err := checkConfig(c); err != nil {
		return nil, err
	}
	var memErr error // agreed with the other ranks once they are joined
	if avail, source, ok := hostmem.Available(); ok {
		memErr = checkHostMemory(c, avail, source)
	}
	s := &session{}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.close())
		}
	}()
	jc := jobConfig(c)
	// Before any pool is allocated, so that a rank that would not fit stops every rank with
	// its cause instead of leaving them waiting for it; with it every rank's configuration,
	// compared by every rank (agreeConfig), before any group is made.
	jc.Start = func(ctx context.Context, world parallel.Group, opts *hicache.Options) error {
		payloads, err := hicache.AgreeStart(ctx, world, "checking host memory", memErr, encodeStart(c, lastGen, world.Size()))
		if err != nil {
			return err
		}
		opts.Generation, err = agreeConfig(payloads)
		return err
	}
	rk, err := job.Open(ctx, jc)
	if errors.Is(err, job.ErrBadValue) {
		// A value that does not fit the job (the layout's world, an unknown consensus
		// backend) is CPCACHE_ERR_INVALID.
		err = fmt.Errorf("%w: %w", errInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, rk.Close)
	s.cache, s.engine, s.l1Base = rk.Cache, rk.HostEngine, rk.L1Host
	s.metricsText = rk.MetricsText
	s.l1Buffers = len(c.kv.kvBufs) > 0
	rank, layout := rk.Rank(), rk.Layout
	coord := layout.Coord(rank)
	s.info = sessionInfo{
		rank: rank, world: rk.World.Size(), cpRank: s.cache.CPRank(), cpSize: rk.Set.Size(), tpRank: coord.TP, dpRank: coord.DP,
		replicaSize: len(layout.ReplicaGroup(rank)), pageTokens: c.pageTokens, pageBytes: c.pageBytes,
		l1Pages: c.l1Pages, l2Pages: c.l2Pages, consensus: rk.Backend,
	}
	if perToken, perPage, ok := kvSizes(c, layout.AttnTP); ok {
		s.info.kvBytesPerToken, s.info.kvPageBytes = perToken, perPage
	}
	return s, nil
}

// jobConfig is c as a job.Config: the C ABI's L1 kinds and slab backends in job's terms.
func jobConfig(c *openConfig) job.Config {
	jc := job.Config{
		Store: c.store, Rendezvous: c.rendezvous, JobID: c.jobID, StoreArg: storeArg, Timeout: c.timeout, StepTimeout: c.timeout, Layout: c.layout,
		PageTokens: c.pageTokens, PageBytes: c.pageBytes, L1Pages: c.l1Pages, L2Pages: c.l2Pages,
		Options: c.options, Consensus: c.consensus, L1Base: c.l1Base, Device: c.device,
		Tag: "libcpcache", SlabLayout: fmt.Sprintf("%d B/page, %d tokens/page", c.pageBytes, c.pageTokens),
		StorageURL: c.storageURL, StorageModel: c.model,
		KVLayout: c.kv.kvLayout, L1Buffers: c.kv.kvBufs, L2Layout: c.kv.l2Layout,
		KVEvents: c.kvEvents, MetricsAddr: c.metricsAddr,
	}
	if c.rank >= 0 {
		jc.Rank, jc.Size, jc.LocalSize = c.rank, c.layout.World, c.localWorld
	}
	switch {
	case c.kv.device:
		jc.L1 = job.L1Device // the engine's device buffers: the CUDA engine's per-layer copies (cudaengine.NewKV)
	case len(c.kv.kvBufs) > 0:
		jc.L1 = job.L1Cache // the engine's host buffers: hicache's layered host engine over them
	case c.l1Kind == l1Host:
		jc.L1 = job.L1Host
	case c.l1Kind == l1Device:
		jc.L1 = job.L1Device
	default:
		jc.L1 = job.L1HostAlloc
	}
	switch {
	case c.slabKind == slabCUDAIPC:
		jc.L2 = job.L2Device
	case c.pinHost:
		jc.L2 = job.L2Pinned
	}
	return jc
}

// close releases everything in reverse order of creation. Idempotent.
func (s *session) close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}
