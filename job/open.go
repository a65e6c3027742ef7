package job

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/cudaengine"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/hostengine"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/metrics"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/shm"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/slab/cudaslab"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// Rank is one open rank of the job and everything it owns.
type Rank struct {
	Cache   *hicache.Cache
	World   parallel.Group
	Groups  Groups
	Layout  *parallel.Layout
	Counted *parallel.Counted // the consensus group, counted (the cache's group)
	Backend string            // the consensus backend: "shm" or "gloo" (or the in-process group's)
	Slabs   hicache.SlabSet   // the L2 of this rank's slab group
	// SharedSlabs: the attention-TP ranks of a CP index share one slab (SharesSlabs): Slabs
	// is the layout's SharedSlabGroup, and this rank writes its slab only if it is the
	// slab's maker (parallel.Layout.SharedSlabWriter).
	SharedSlabs bool
	Set         *slab.Set      // Slabs when Open opened them (nil with Config.Slabs)
	Engine      hicache.Engine // the copy engine Open made (nil with L1Cache: the cache's own)
	// HostEngine is Engine with a host L1 (L1HostAlloc, L1Host).
	HostEngine *hostengine.Engine
	L1Host     unsafe.Pointer // the host L1 pool (L1HostAlloc, L1Host)
	Device     *cuda.Device   // nil without CUDA
	DeviceName string
	L1Device   cuda.DevicePtr // the device L1 pool (L1Device without KVL1 or L1Buffers)
	// KVL1 is Config.KVL1 (the engine's per-layer L1 buffers), L2Layout the slabs' layout
	// (Config.L2Layout, 0 taken as kvmem.PageFirst).
	KVL1      *kvmem.L1
	L2Layout  kvmem.L2Layout
	Storage   storage.Storage
	Namespace storage.Namespace
	// Events publishes the replica's KV events (Config.KVEvents) on its leader; nil on the
	// other ranks and without an endpoint. Closed by Close before the cache.
	Events *kvevents.ReplicaPublisher
	// Metrics is this rank's registry (metrics.NewRankRegistry: the cache's collector, the
	// storage's counters, the publisher's on the replica's leader); callers may register
	// more. Served on Config.MetricsAddr; MetricsText renders it.
	Metrics *prometheus.Registry
	// MetricsAddr is the address Config.MetricsAddr is served on ("" without one).
	MetricsAddr string

	metrics   atomic.Pointer[prometheus.Registry] // Metrics once built, for the server started before it
	cudaSlabs *cudaslab.Backend                   // CUDA IPC and pinned slabs' backends (nil without CUDA)
	closers   []func() error
	closed    bool
}

// Rank is this rank's place in the world.
func (r *Rank) Rank() int { return r.World.Rank() }

// Close releases everything in the reverse order of creation: the cache, the storage, the
// engine, the slabs, the device, the consensus group, the groups and the world. Idempotent;
// the errors are joined.
func (r *Rank) Close() error {
	if r == nil || r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i]())
	}
	r.closers = nil
	return errors.Join(errs...)
}

func (r *Rank) onClose(f func() error) { r.closers = append(r.closers, f) }

// Open assembles this rank (see the package doc). On failure everything made so far is
// closed and the error names the step, and, for a step one rank can fail alone, the lowest
// failing rank and its cause, on every rank.
func Open(ctx context.Context, cfg Config) (_ *Rank, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.StepWarnAfter, err = stepWarnAfter(cfg.StepWarnAfter, os.LookupEnv); err != nil {
		return nil, err
	}
	r := &Rank{}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	if cfg.Events == (hicache.EventOptions{}) {
		cfg.Events = cfg.KVEvents.EventOptions()
	}
	if cfg.MetricsAddr != "" {
		// Before any collective: a bad or busy address stops this rank before it joins.
		if err := r.serveMetrics(cfg.MetricsAddr); err != nil {
			return nil, err
		}
	}
	if err := r.openWorld(ctx, &cfg); err != nil {
		return nil, err
	}
	if cfg.Start != nil {
		if err := cfg.Start(ctx, r.World, &cfg.Options); err != nil {
			return nil, err
		}
	}
	if err := r.openGroups(ctx, &cfg); err != nil {
		return nil, err
	}
	if err := r.openDevice(ctx, &cfg); err != nil {
		return nil, err
	}
	if err := r.openSlabs(ctx, &cfg); err != nil {
		return nil, err
	}
	if err := r.openEngine(ctx, &cfg); err != nil {
		return nil, err
	}
	if err := r.openStorage(ctx, &cfg); err != nil {
		return nil, err
	}
	opts := cfg.Options
	opts.PageSize, opts.L1Pages = cfg.PageTokens, cfg.L1Pages
	hc := hicache.Config{
		Options: opts, Layout: r.Layout, Rank: r.World.Rank(), Group: r.Counted, Slabs: r.Slabs, Engine: r.Engine, KVLayout: cfg.KVLayout,
		ShareSlabs: r.SharedSlabs,
		L1:         cfg.KVL1, L2Layout: cfg.L2Layout,
		StepTimeout: cfg.StepTimeout, LatencySamples: cfg.LatencySamples, Faults: cfg.Faults, Events: cfg.Events,
		StepWarnAfter: cfg.StepWarnAfter,
	}
	if r.Storage != nil {
		hc.Storage, hc.StorageNamespace, hc.L3 = r.Storage, r.Namespace, cfg.L3
	}
	if r.Cache, err = hicache.New(ctx, hc); err != nil {
		return nil, err
	}
	r.onClose(r.Cache.Close)
	if err := r.startEvents(ctx, &cfg); err != nil {
		return nil, err
	}
	r.Metrics = metrics.NewRankRegistry(r.Cache, metrics.RankLabels(r.Layout, r.Rank()), r.Storage, r.publisher())
	r.metrics.Store(r.Metrics)
	return r, nil
}

// MetricsText is this rank's metrics (Metrics) in Prometheus' text exposition format.
func (r *Rank) MetricsText() ([]byte, error) { return metrics.Text(r.Metrics) }

// publisher is the replica's publisher, nil when this rank has none.
func (r *Rank) publisher() *kvevents.Publisher {
	if r.Events == nil {
		return nil
	}
	return r.Events.Publisher
}

// serveMetrics serves, on addr's /metrics, this process's Go and process collectors and the
// rank's registry once it is built (nothing of the rank before).
func (r *Rank) serveMetrics(addr string) error {
	rank := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		if reg := r.metrics.Load(); reg != nil {
			return reg.Gather()
		}
		return nil, nil
	})
	srv, err := metrics.Serve(addr, prometheus.Gatherers{metrics.ServingRegistry(), rank})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadValue, err)
	}
	r.onClose(srv.Close)
	r.MetricsAddr = srv.Addr()
	return nil
}

// startEvents starts the replica's KV event publisher on its leader (Config.KVEvents), once
// the layout numbers the last replica's endpoints, agreed by every rank: a leader that could
// not start it (libzmq missing, an endpoint in use) stops every rank with its cause.
func (r *Rank) startEvents(ctx context.Context, cfg *Config) error {
	if cfg.KVEvents.Endpoint == "" {
		return nil
	}
	rank := r.Rank()
	var ce *kvevents.ConfigError
	if err := cfg.KVEvents.Check(r.Layout.AttnDP); errors.As(err, &ce) {
		// Every rank has the same layout and configuration: every rank returns this.
		return fmt.Errorf("%w: KV events %s %q: %v", ErrBadValue, ce.Field, ce.Value, ce.Err)
	} else if err != nil {
		return fmt.Errorf("%w: KV events: %w", ErrBadValue, err)
	}
	var local error
	if r.Layout.ReplicaGroup(rank)[0] == rank {
		log := cfg.KVEventsLog
		if log == nil {
			log = func(err error) { fmt.Fprintf(os.Stderr, "cpcache: rank %d: %v\n", rank, err) }
		}
		dp := r.Layout.Coord(rank).DP
		pub, err := kvevents.StartReplica(r.Cache, cfg.KVEvents, dp, log)
		if err != nil {
			local = fmt.Errorf("job: rank %d (replica %d): %w", rank, dp, err)
		} else {
			r.Events = pub
			r.onClose(pub.Close) // before the cache's: the final dump reads it
		}
	}
	_, err := hicache.AgreeStart(ctx, r.World, "starting the KV event publisher", local, "")
	return err
}

// openWorld makes the world (or takes the in-process one) and the layout.
func (r *Rank) openWorld(ctx context.Context, cfg *Config) error {
	if cfg.Timeout == 0 {
		cfg.Timeout = parallel.DefaultTimeout
	}
	if cfg.World != nil {
		r.World = cfg.World
	} else {
		world, err := gloo.NewWorld(ctx, gloo.Options{Store: cfg.Store, Rendezvous: cfg.Rendezvous, StoreArg: cfg.StoreArg,
			JobID: cfg.JobID, Rank: cfg.Rank, Size: cfg.Size, LocalSize: cfg.LocalSize, Timeout: cfg.Timeout})
		if err != nil {
			return err
		}
		r.World = world
		r.onClose(world.Close)
	}
	return nil
}

// glooGroups adapts gloo.LayoutGroups to Groups.
type glooGroups struct{ lg *gloo.LayoutGroups }

func (g glooGroups) Group(kind parallel.GroupKind) parallel.Group { return g.lg.Group(kind) }

// openGroups builds the layout, its groups and the consensus group.
func (r *Rank) openGroups(ctx context.Context, cfg *Config) error {
	lc := cfg.Layout
	if lc.World == 0 {
		lc.World = r.World.Size()
	}
	layout, err := parallel.NewLayout(lc)
	if err != nil {
		return err
	}
	if layout.Config.World != r.World.Size() {
		return fmt.Errorf("%w: the layout %s needs %d ranks, the job has %d", ErrBadValue, layout, layout.Config.World, r.World.Size())
	}
	r.Layout = layout
	if cfg.Groups != nil {
		r.Groups = cfg.Groups
	} else {
		world, ok := r.World.(*gloo.Group)
		if !ok {
			return fmt.Errorf("%w: layout groups need a Gloo world or Config.Groups", ErrBadValue)
		}
		lg, err := gloo.NewLayoutGroups(world, layout)
		if err != nil {
			return err
		}
		r.onClose(lg.Close)
		r.Groups = glooGroups{lg}
	}
	replica := r.Groups.Group(parallel.KindReplica)
	if cfg.World != nil {
		// In-process: the replica group is the consensus group.
		r.Counted, r.Backend = parallel.Count(replica), "local"
		return nil
	}
	cons, backend, err := shm.Consensus(ctx, replica, shm.Options{Backend: cfg.Consensus, Timeout: cfg.StepTimeout})
	if err != nil {
		if errors.Is(err, shm.ErrUnknownBackend) {
			err = fmt.Errorf("%w: %w", ErrBadValue, err)
		}
		return err
	}
	r.onClose(cons.Close)
	if backend == shm.BackendBootstrap {
		backend = "gloo"
	}
	r.Counted, r.Backend = parallel.Count(cons), backend
	return nil
}

// openDevice opens the CUDA slab backend, the device and the device L1 pool when the
// configuration needs them, agreed by every rank with CUDA or without (agreeDevice).
func (r *Rank) openDevice(ctx context.Context, cfg *Config) error {
	var local error
	if cfg.usesCUDA() {
		local = r.openCUDA(cfg)
	}
	return agreeDevice(ctx, r.World, local)
}

func (r *Rank) openCUDA(cfg *Config) error {
	ordinal := cfg.Device
	if cfg.PickDevice != nil {
		drv, err := cuda.Open()
		if err != nil {
			return fmt.Errorf("job: CUDA: %w", err)
		}
		n, err := drv.DeviceCount()
		drv.Close() // the backend below holds its own reference
		if err != nil {
			return fmt.Errorf("job: CUDA: %w", err)
		}
		if ordinal, err = cfg.PickDevice(n); err != nil {
			return err
		}
	}
	be, err := cudaslab.Open(ordinal)
	if err != nil {
		if len(cfg.L1Buffers) > 0 && cfg.L1 == L1Device {
			b := cfg.L1Buffers[0]
			return fmt.Errorf("job: CUDA for the %d device L1 buffers (the first: layer %d part %d) on device %d: %w", len(cfg.L1Buffers), b.Layer, b.Part, ordinal, err)
		}
		return fmt.Errorf("job: CUDA (device L1, CUDA IPC or pinned slabs): %w", err)
	}
	r.onClose(be.Close)
	r.cudaSlabs = be
	if r.Device, err = be.Device(ordinal); err != nil {
		return fmt.Errorf("job: CUDA device %d: %w", ordinal, err)
	}
	if r.DeviceName, err = r.Device.Name(); err != nil {
		return fmt.Errorf("job: CUDA device %d: %w", ordinal, err)
	}
	if cfg.DeviceKVL1 {
		if err := r.allocDeviceKVL1(cfg); err != nil {
			return err
		}
	} else if cfg.L1 == L1Device && cfg.KVL1 == nil && len(cfg.L1Buffers) == 0 {
		if cfg.L1Base != nil {
			r.L1Device = cuda.DevicePtr(uintptr(cfg.L1Base))
		} else {
			buf, err := r.Device.Alloc(cfg.L1Pages * cfg.PageBytes)
			if err != nil {
				return fmt.Errorf("job: L1 pool of %d pages × %d bytes on device %d: %w", cfg.L1Pages, cfg.PageBytes, ordinal, err)
			}
			r.onClose(buf.Close)
			r.L1Device = buf.Ptr()
		}
	}
	if cfg.OnDevice != nil {
		closeFn, err := cfg.OnDevice(r.Device)
		if err != nil {
			return err
		}
		if closeFn != nil {
			r.onClose(closeFn)
		}
	}
	return nil
}

// allocDeviceKVL1 allocates Config.DeviceKVL1's buffers on the rank's device and sets
// cfg.KVL1 to them (the engine step takes it from there).
func (r *Rank) allocDeviceKVL1(cfg *Config) error {
	shape, err := kvmem.NewShape(*cfg.KVLayout, r.Layout.AttnTP, cfg.PageTokens)
	if err != nil {
		return fmt.Errorf("%w: per-layer device L1: %w", ErrBadValue, err)
	}
	var bufs []kvmem.Buffer
	for l := range shape.Layers() {
		for j := range shape.Parts() {
			size := int64(cfg.L1Pages) * shape.ChunkBytes(j)
			buf, err := r.Device.Alloc(int(size))
			if err != nil {
				return fmt.Errorf("job: L1 buffer of layer %d part %d (%d bytes) on device %d: %w", l, j, size, r.Device.Ordinal(), err)
			}
			r.onClose(buf.Close)
			bpt := int64(shape.PartBytesPerToken(j))
			bufs = append(bufs, kvmem.Buffer{Layer: l, Part: j, Device: uintptr(buf.Ptr()), Bytes: size,
				PageStride: int64(shape.PageTokens()) * bpt, TokenStride: bpt})
		}
	}
	if cfg.KVL1, err = kvmem.NewL1(shape, cfg.L1Pages, bufs); err != nil {
		return err
	}
	return nil
}

// agreeDevice is the one agreement on this rank's CUDA step (local: its failure, nil on
// success or without CUDA). Every rank returns the same verdict: nil, or a
// *hicache.StartError naming the lowest failing rank, with a cause that counts and names
// every failing rank with its error ("opening CUDA: failed on 2 of 4 ranks: rank 1: ...;
// rank 3: ..."); on a failing rank it also wraps that rank's own error.
func agreeDevice(ctx context.Context, world parallel.Group, local error) error {
	const what = "opening CUDA"
	msg := ""
	if local != nil {
		msg = local.Error()
		msg = msg[:min(len(msg), hicache.StartCauseLen)]
	}
	all, err := world.AllGather(ctx, []byte(msg))
	if err != nil {
		return errors.Join(local, fmt.Errorf("job: agreeing on %s: %w", what, err))
	}
	var failed []string
	lowest := -1
	for i, b := range all {
		if len(b) == 0 {
			continue
		}
		if lowest < 0 {
			lowest = i
		}
		failed = append(failed, fmt.Sprintf("rank %d: %s", world.Ranks()[i], b))
	}
	if lowest < 0 {
		return nil
	}
	return &hicache.StartError{
		Rank: world.Ranks()[lowest], Group: world.Name(), Err: local,
		Cause: fmt.Sprintf("%s: failed on %d of %d ranks: %s", what, len(failed), len(all), strings.Join(failed, "; ")),
	}
}

// openSlabs opens the L2 slab set over the slab group (unless Config.Slabs is given).
func (r *Rank) openSlabs(ctx context.Context, cfg *Config) error {
	if cfg.BeforeSlabs != nil {
		cfg.BeforeSlabs()
	}
	r.SharedSlabs = SharesSlabs(r.Layout, cfg.KVLayout, cfg.SeparateSlabs)
	if cfg.Slabs != nil {
		r.Slabs = cfg.Slabs
		return nil
	}
	spec := slab.Spec{Backend: slab.Host, PageSize: cfg.PageBytes, Pages: cfg.L2Pages, Tag: cfg.Tag, Layout: cfg.SlabLayout}
	switch cfg.L2 {
	case L2Pinned:
		spec.PinHost, spec.Device = true, cfg.Device
		if r.Device != nil {
			spec.Device = r.Device.Ordinal()
		}
	case L2Device:
		spec.Backend, spec.Device = slab.CUDAIPC, r.Device.Ordinal()
	}
	if r.cudaSlabs != nil {
		spec = r.cudaSlabs.Spec(spec) // the device backend and host pinner of CUDA IPC and pinned slabs
	}
	var set *slab.Set
	var err error
	if r.SharedSlabs {
		set, err = r.openSharedSlabs(ctx, spec)
	} else {
		set, err = slab.OpenSet(ctx, r.Groups.Group(parallel.KindSlab), spec)
	}
	if err != nil {
		return err
	}
	r.onClose(set.Close)
	r.Set, r.Slabs = set, set
	return nil
}

// openSharedSlabs opens the shared slabs over the replica group (every rank that maps
// them): the makers are the layout's SharedSlabGroup, at their replica-group positions.
func (r *Rank) openSharedSlabs(ctx context.Context, spec slab.Spec) (*slab.Set, error) {
	replica := r.Groups.Group(parallel.KindReplica)
	if replica == nil {
		return nil, fmt.Errorf("%w: shared slabs need the replica group", ErrBadValue)
	}
	members := replica.Ranks()
	var makers []int
	for _, m := range r.Layout.SharedSlabGroup(r.World.Rank()) {
		makers = append(makers, slices.Index(members, m))
	}
	return slab.OpenSharedSet(ctx, replica, spec, makers)
}

// openEngine makes the copy engine over the L1 pool (none with L1Cache), agreed by every
// rank: a rank whose pool or engine could not be made stops every rank with its cause.
func (r *Rank) openEngine(ctx context.Context, cfg *Config) error {
	local := r.makeEngine(cfg)
	_, err := hicache.AgreeStart(ctx, r.World, "making the copy engine", local, "")
	return err
}

func (r *Rank) makeEngine(cfg *Config) error {
	size := cfg.L1Pages * cfg.PageBytes
	if len(cfg.L1Buffers) > 0 {
		// Only now is the layout's attention-TP size known (Config.L1Buffers); cfg.KVL1 is
		// what hicache.Config.L1 gets.
		shape, err := kvmem.NewShape(*cfg.KVLayout, r.Layout.AttnTP, cfg.PageTokens)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadValue, err)
		}
		if cfg.KVL1, err = kvmem.NewL1(shape, cfg.L1Pages, cfg.L1Buffers); err != nil {
			return fmt.Errorf("%w: %w", ErrBadValue, err)
		}
	}
	r.KVL1, r.L2Layout = cfg.KVL1, cfg.L2Layout
	if r.L2Layout == 0 {
		r.L2Layout = kvmem.PageFirst
	}
	if cfg.KVL1 != nil && cfg.KVL1.Shape().AttnTP() != r.Layout.AttnTP {
		return fmt.Errorf("%w: the per-layer L1 is shaped for attention-TP %d, the layout %s has attention-TP %d",
			ErrBadValue, cfg.KVL1.Shape().AttnTP(), r.Layout, r.Layout.AttnTP)
	}
	var e hicache.Engine
	switch cfg.L1 {
	case L1Cache:
		return nil // the cache's own host engine (over KVL1 when set)
	case L1Device:
		if r.Set == nil {
			return fmt.Errorf("%w: a device L1 needs slabs Open opens", ErrBadValue)
		}
		var ce *cudaengine.Engine
		var err error
		if cfg.KVL1 != nil {
			var kv cudaengine.KV
			if kv, err = cudaengine.KVOf(cfg.KVL1, r.L2Layout, cfg.L2Pages, cudaengine.DevicePageAddr(r.Set)); err == nil {
				ce, err = cudaengine.NewKV(r.Device, kv, cudaengine.Options{})
			}
		} else {
			ce, err = cudaengine.New(r.Device, r.L1Device, cfg.L1Pages, cfg.PageBytes, cudaengine.DevicePageAddr(r.Set), cudaengine.Options{})
		}
		if err != nil {
			return err
		}
		r.onClose(ce.Close)
		e = ce
	default:
		if cfg.L1 == L1Host {
			r.L1Host = cfg.L1Base
		} else {
			// Anonymous memory, not the Go heap: its address may be handed to C.
			mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
			if err != nil {
				return fmt.Errorf("job: allocating an L1 pool of %d bytes: %w", size, err)
			}
			r.onClose(func() error { return syscall.Munmap(mem) })
			r.L1Host = unsafe.Pointer(unsafe.SliceData(mem))
		}
		slabs, ok := r.Slabs.(engine.HostSlabs)
		if !ok {
			return fmt.Errorf("%w: a host L1 needs host slabs", ErrBadValue)
		}
		he, err := hostengine.New(slabs, cfg.L1Pages, cfg.PageBytes, hostengine.Options{Pool: unsafe.Slice((*byte)(r.L1Host), size)})
		if err != nil {
			return err
		}
		r.onClose(he.Close)
		r.HostEngine, e = he, he
	}
	if cfg.WrapEngine != nil {
		e = cfg.WrapEngine(e)
	}
	r.Engine = e
	return nil
}

// openStorage opens this rank's storage handle, agrees the outcome and the MAC key with
// every rank (agreeStorage), wraps it (Config.WrapStorage) and clears it on rank 0
// (Config.ClearStorage, agreed). Every rank takes part, with a storage or without.
func (r *Rank) openStorage(ctx context.Context, cfg *Config) error {
	var openErr error
	if cfg.StorageURL != "" {
		openErr = r.openStorageHandle(ctx, cfg)
	}
	if err := agreeStorage(ctx, r.World, r.Storage, openErr); err != nil {
		return err
	}
	if r.Storage == nil {
		return nil
	}
	if cfg.WrapStorage != nil {
		r.Storage = cfg.WrapStorage(r.Storage) // after the key check: a wrapper hides the key
	}
	if cfg.ClearStorage == nil {
		return nil
	}
	return r.clearStorage(ctx, cfg)
}

func (r *Rank) openStorageHandle(ctx context.Context, cfg *Config) error {
	ns, err := hicache.NewStorageNamespace(cfg.StorageModel, r.Layout, cfg.PageTokens, cfg.PageBytes, cfg.KVLayout)
	if err == nil {
		octx, cancel := withTimeout(ctx, cfg.StorageTimeout)
		opts := cfg.StorageOptions
		opts.Namespace = ns
		var st storage.Storage
		st, err = stores.Open(octx, cfg.StorageURL, opts)
		cancel()
		if st != nil {
			r.onClose(st.Close)
			r.Storage, r.Namespace = st, ns
		}
	}
	if err != nil && cfg.StorageError != nil {
		err = cfg.StorageError(err)
	}
	return err
}

// clearStorage clears the storage on rank 0; no cache reads it before it is clear, and a
// failed clear is agreed: every rank stops with rank 0's cause rather than wait for it.
func (r *Rank) clearStorage(ctx context.Context, cfg *Config) error {
	var clearErr error
	msg := ""
	if r.World.Rank() == 0 {
		cctx, cancel := withTimeout(ctx, cfg.StorageTimeout)
		clearErr = cfg.ClearStorage(cctx, r.Storage)
		cancel()
		if clearErr != nil {
			msg = clearErr.Error()
			msg = msg[:min(len(msg), hicache.StartCauseLen)]
		}
	}
	all, err := r.World.AllGather(ctx, []byte(msg))
	if err != nil {
		return errors.Join(fmt.Errorf("job: after clearing the storage: %w", err), clearErr)
	}
	if clearErr != nil {
		return clearErr
	}
	if len(all[0]) > 0 {
		return fmt.Errorf("job: clearing the storage failed on rank 0: %s", all[0])
	}
	return nil
}

func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// EnvStepWarnMs is the variable that sets Config.StepWarnAfter, in milliseconds (0: never
// warn), when the config leaves it 0.
const EnvStepWarnMs = "CPCACHE_STEP_WARN_MS"

// stepWarnAfter is the cache's StepWarnAfter: d when set, else EnvStepWarnMs's (0 there:
// never, which hicache spells negative), else 0 (hicache's default).
func stepWarnAfter(d time.Duration, lookup func(string) (string, bool)) (time.Duration, error) {
	v, ok := lookup(EnvStepWarnMs)
	if d != 0 || !ok || v == "" {
		return d, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, fmt.Errorf("%w: %s=%q is not a number of milliseconds (0: never warn)", ErrBadValue, EnvStepWarnMs, v)
	}
	if ms == 0 {
		return -1, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}
