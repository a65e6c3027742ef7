package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/cudaengine"
	"github.com/cpcache/cpcache/hicache/hostengine"
	"github.com/cpcache/cpcache/internal/hostmem"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/shm"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/slab/cudaslab"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
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
	storageURL string
	model      string
}

// maxTimeoutMs is the largest timeout_ms a time.Duration holds (about 292 years).
const maxTimeoutMs = math.MaxInt64 / int64(time.Millisecond)

// checkConfig rejects values no rank could use, naming the field.
func checkConfig(c *openConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errInvalid}, args...)...)
	}
	switch {
	case c.layout.World < 0:
		return bad("world %d is negative", c.layout.World)
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
	case c.l1Kind != l1Alloc && c.l1Base == nil:
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
	case c.timeout <= 0:
		ms := c.timeoutMs
		if ms == 0 {
			ms = c.timeout.Milliseconds()
		}
		return bad("timeout_ms %d must be in 1..%d", ms, maxTimeoutMs)
	}
	return nil
}

// session is the process's open cache and everything it owns, closed in reverse order.
type session struct {
	handle uint64     // set once before the session is published
	mu     sync.Mutex // protects closed and nodes; held through every call on the session
	closed bool
	// quarantined: a Step returned a divergence and no recovery has been seen since;
	// recoveries is Stats.Recoveries when last read (see stepped).
	quarantined bool
	recoveries  int64
	cache       *hicache.Cache
	engine      *hostengine.Engine // nil with a device L1
	l1Base      unsafe.Pointer     // host L1 pool (nil with a device L1): memory outside the Go heap
	info        sessionInfo
	closers     []func() error
	nodes       nodeTable
}

// sessionInfo is what cpcache_get_info reports.
type sessionInfo struct {
	rank, world, cpRank, cpSize, tpRank, dpRank, replicaSize int
	pageTokens, pageBytes, l1Pages, l2Pages                  int
	consensus                                                string
}

// openSession joins the job and builds the cache (see cpcache_open). Its node-handle
// generations start above lastGen, this process's last one, and above every other rank's
// (agreed with the host-memory check), so that handles stay equal on every rank. On failure
// everything made so far is closed.
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
	wopts := gloo.Options{Store: c.store, Timeout: c.timeout}
	if c.rank >= 0 {
		wopts.Rank, wopts.Size = c.rank, c.layout.World
	}
	world, err := gloo.NewWorld(ctx, wopts)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, world.Close)
	// Before any pool is allocated, so that a rank that would not fit stops every rank with
	// its cause instead of leaving them waiting for it; with it every rank's configuration,
	// compared by every rank (agreeConfig), before any group is made.
	payloads, err := hicache.AgreeStart(ctx, world, "checking host memory", memErr, encodeStart(c, lastGen, world.Size()))
	if err != nil {
		return nil, err
	}
	if s.nodes.gen, err = agreeConfig(payloads); err != nil {
		return nil, err
	}
	lc := c.layout
	if lc.World == 0 {
		lc.World = world.Size()
	}
	layout, err := parallel.NewLayout(lc)
	if err != nil {
		return nil, err
	}
	if layout.Config.World != world.Size() {
		return nil, fmt.Errorf("%w: the layout %s needs %d ranks, the job has %d", errInvalid, layout, layout.Config.World, world.Size())
	}
	groups, err := gloo.NewLayoutGroups(world, layout)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, groups.Close)
	cons, backend, err := shm.Consensus(ctx, groups.Group(parallel.KindReplica), shm.Options{Backend: c.consensus, Timeout: c.timeout})
	if err != nil {
		// An unknown backend is a bad value (CPCACHE_ERR_INVALID), not an I/O error.
		if errors.Is(err, shm.ErrUnknownBackend) {
			err = fmt.Errorf("%w: %w", errInvalid, err)
		}
		return nil, err
	}
	s.closers = append(s.closers, cons.Close)
	if backend == shm.BackendBootstrap {
		backend = "gloo"
	}
	var be *cudaslab.Backend
	var dev *cuda.Device
	var cudaErr error
	if c.l1Kind == l1Device || c.slabKind == slabCUDAIPC || c.pinHost {
		be, dev, cudaErr = s.openCUDA(c.device)
	}
	// Agreed by every rank, with CUDA or without: a rank whose CUDA failed (its own device
	// ordinal, driver) used to leave the others with a lost peer at the slab exchange, and no
	// cause.
	if _, err := hicache.AgreeStart(ctx, world, "opening CUDA", cudaErr, ""); err != nil {
		return nil, err
	}
	spec := slab.Spec{Backend: slab.Host, PageSize: c.pageBytes, Pages: c.l2Pages, Device: c.device, PinHost: c.pinHost,
		Tag: "libcpcache", Layout: fmt.Sprintf("%d B/page, %d tokens/page", c.pageBytes, c.pageTokens)}
	if c.slabKind == slabCUDAIPC {
		spec.Backend = slab.CUDAIPC
	}
	set, err := slab.OpenSet(ctx, groups.Group(parallel.KindSlab), be.Spec(spec))
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, set.Close)
	engine, err := s.newEngine(c, set, dev)
	if err != nil {
		return nil, err
	}
	rank := world.Rank()
	opts := c.options
	opts.PageSize, opts.L1Pages = c.pageTokens, c.l1Pages
	hc := hicache.Config{Options: opts, Layout: layout, Rank: rank, Group: cons, Slabs: set, Engine: engine, StepTimeout: c.timeout}
	// Every rank takes part in the agreement, with a storage or without (agreeStorage).
	var st storage.Storage
	var ns storage.Namespace
	if c.storageURL != "" {
		ns, err = hicache.NewStorageNamespace(c.model, layout, c.pageTokens, c.pageBytes)
		if err == nil {
			st, err = stores.Open(ctx, c.storageURL, storage.Options{Namespace: ns})
		}
		if st != nil {
			s.closers = append(s.closers, st.Close)
		}
	}
	if err := agreeStorage(ctx, world, st, err); err != nil {
		return nil, err
	}
	if st != nil {
		hc.Storage, hc.StorageNamespace = st, ns
	}
	if s.cache, err = hicache.New(ctx, hc); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, s.cache.Close)
	coord := layout.Coord(rank)
	s.info = sessionInfo{
		rank: rank, world: world.Size(), cpRank: s.cache.CPRank(), cpSize: set.Size(), tpRank: coord.TP, dpRank: coord.DP,
		replicaSize: len(layout.ReplicaGroup(rank)), pageTokens: c.pageTokens, pageBytes: c.pageBytes,
		l1Pages: c.l1Pages, l2Pages: c.l2Pages, consensus: backend,
	}
	s.nodes.init()
	return s, nil
}

// openCUDA opens the CUDA slab backend (for the slab.Spec) and device.
func (s *session) openCUDA(device int) (*cudaslab.Backend, *cuda.Device, error) {
	be, err := cudaslab.Open(device)
	if err != nil {
		return nil, nil, fmt.Errorf("cpcache: CUDA (device L1, CUDA IPC or pinned slabs): %w", err)
	}
	s.closers = append(s.closers, be.Close)
	dev, err := be.Device(device)
	return be, dev, err
}

// newEngine makes the copy engine over the L1 pool the configuration names.
func (s *session) newEngine(c *openConfig, set *slab.Set, dev *cuda.Device) (hicache.Engine, error) {
	size := c.l1Pages * c.pageBytes
	switch c.l1Kind {
	case l1Device:
		// Device slabs, or pinned host slabs through their registered device pointers.
		addr := cudaengine.DevicePageAddr(set)
		e, err := cudaengine.New(dev, cuda.DevicePtr(uintptr(c.l1Base)), c.l1Pages, c.pageBytes, addr, cudaengine.Options{})
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, e.Close)
		return e, nil
	case l1Host:
		s.l1Base = c.l1Base
	default:
		// Anonymous memory, not the Go heap: its address is handed to C (cpcache_l1_page).
		mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			return nil, fmt.Errorf("cpcache: allocating an L1 pool of %d bytes: %w", size, err)
		}
		s.closers = append(s.closers, func() error { return syscall.Munmap(mem) })
		s.l1Base = unsafe.Pointer(unsafe.SliceData(mem))
	}
	e, err := hostengine.New(set, c.l1Pages, c.pageBytes, hostengine.Options{Pool: unsafe.Slice((*byte)(s.l1Base), size)})
	if err != nil {
		return nil, err
	}
	s.engine = e
	s.closers = append(s.closers, e.Close)
	return e, nil
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
