package hicache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/hostengine"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/storage"
)

// Config configures a Cache.
type Config struct {
	Options
	// Layout is the job's parallel layout; Rank is this process's global rank in it.
	Layout *parallel.Layout
	Rank   int
	// Group is the consensus group: the layout's replica group of Rank. Every rank that
	// shares a slab with this one must be in it (New checks).
	Group parallel.Group
	// Slabs is the L2 of Rank's slab group (slab.OpenSet over the layout's slab group; with
	// ShareSlabs, slab.OpenSharedSet over the replica group, made by the layout's
	// SharedSlabGroup).
	Slabs SlabSet
	// ShareSlabs: the attention-TP ranks of a CP index share one slab (one L2 copy per DP
	// block's CP group instead of attention-TP copies), which needs a KVLayout whose every
	// part is replicated across attention-TP (MLA: every TP rank holds the same bytes). Slabs
	// is then the layout's SharedSlabGroup: slab c made by the CP-index-c rank of TP index 0,
	// its writer (parallel.Layout.SharedSlabWriter). Only writers copy backups into L2 and
	// run storage I/O (each page is stored once); the other TP ranks report their share of
	// those done without copying, and the group's commit still waits for the writer. Every
	// rank loads pages back into its own L1. Every rank of the group must set it alike.
	ShareSlabs bool
	// KVLayout is the shape of the engine's KV memory (layers, and per layer its parts); nil
	// leaves pages opaque. When set, one page of Options.PageSize tokens at the layout's
	// attention-TP size must take exactly the slab page size (New checks), and every rank of
	// the group must give an equal layout: New fails on every rank with a
	// *LayoutMismatchError naming the lowest differing rank and the first differing part.
	// It is part of the storage namespace (NewStorageNamespace).
	KVLayout *kvlayout.Layout
	// L1, when set, is the engine's KV memory as per-(layer, part) buffers (kvmem.NewL1), and
	// the default engine (Engine nil) is a layered host engine over it. Its shape must be
	// KVLayout at the layout's attention-TP size and Options.PageSize tokens, and it must have
	// at least the core's L1 page slots (New checks). nil: the default engine keeps its own
	// flat pool of opaque pages.
	L1 *kvmem.L1
	// L2Layout is how the slabs arrange a page's chunks (kvmem.PageFirst, kvmem.LayerFirst); 0
	// is PageFirst. LayerFirst needs KVLayout. Every rank must choose the same (New compares it
	// in the configuration fingerprint); storage always holds page-first bytes.
	L2Layout kvmem.L2Layout
	// Engine moves pages; nil makes a HostEngine over Slabs (which must then implement
	// HostSlabs) with its own host L1 pool of L1Pages pages. The Cache closes an engine it
	// made; a given engine stays the caller's.
	Engine Engine
	// HostEngine tunes the default engine.
	HostEngine HostEngineOptions
	// StepTimeout bounds each collective (0: the context's deadline, or the group's).
	StepTimeout time.Duration
	// LatencySamples is how many recent consensus latencies Stats keeps (default 1024).
	LatencySamples int
	// StepWarnAfter: when transfers or storage operations stay pending this long with no
	// Step (they start only at a step), the cache logs a warning naming step() once and
	// counts each such stretch in Stats.NoStepWarnings; checked at the scheduler's calls (0:
	// DefaultStepWarnAfter; negative: never).
	StepWarnAfter time.Duration
	// Log receives the cache's warnings (nil: the standard logger, on stderr).
	Log func(error)
	// Storage is the L3 tier (nil: none): every rank backs up the pages of committed L2 nodes
	// it owns (those in its slab) to it and prefetches them from it (see Prefetch), through
	// this handle. Every rank of the group must pass its own handle on the same store, or
	// none; the caller owns it and closes it after Close. The slab set must have host pages
	// (HostSlabs).
	Storage storage.Storage
	// StorageNamespace is the namespace Storage was opened with (required with Storage;
	// NewStorageNamespace builds one). It must name everything that changes a page's bytes
	// (model, dtype, KV layout, page size, TP size); keys add the page's 256-bit id and the
	// slab group's TP index (0 on every rank with ShareSlabs: a replicated page is stored
	// once).
	StorageNamespace storage.Namespace
	// L3 tunes the storage protocol.
	L3 L3Options
	// Faults injects failures on this rank (tests, rehearsals); nil injects nothing.
	Faults *Faults
	// Events turns on the KV event stream (Subscribe), published by the replica group's
	// rank 0.
	Events EventOptions
}

// Cache is one rank's hierarchical KV cache: the deterministic core (package core) plus the
// driver that runs its transfers on an Engine, its storage jobs on the L3 tier and its
// consensus step on the replica group. The driver talks to the core only through its
// boundary (Ready, Report, Apply) and its read-only accessors.
//
// Methods are safe for concurrent use (one mutex, never held across a collective), but the
// replicated calls (Match, Insert, Lock, Unlock, EvictL1, EvictL2, LoadBack, Prefetch, Step,
// Flush, ...) must be made by one scheduler goroutine per rank, by every rank of the group in
// the same order with the same arguments — the scheduler's decisions. WaitL1, HintEvict,
// Stats and the digests are local and answer at once, even while a Step waits for a peer.
type Cache struct {
	group      parallel.Group
	engine     Engine
	ownsEngine bool
	cpRank     int
	// clearOnFlush: L3Options.ClearOnFlush is set and this rank is CP rank 0 of its slab group
	// (one Clear per slab group: it removes the whole namespace).
	clearOnFlush bool
	// readsSharedSlab: the slab is shared (Config.ShareSlabs) and this rank is not its writer:
	// its backups into L2 and its storage jobs are done at once without a copy (the writer
	// makes them; the group's commit waits for it through the vector's MIN).
	readsSharedSlab bool
	l1mem           L1Memory // nil when the engine's L1 is not host memory
	timeout         time.Duration
	maxSamples      int
	l3              *l3Driver // nil without storage; runs this rank's share of the storage jobs
	events          *eventHub // nil unless this rank publishes KV events

	mu       sync.Mutex // protects everything below
	core     *core.Core
	stepping bool      // a Step is in its collective (the mutex is released meanwhile)
	inflight []*Ticket // submitted tickets not yet reported to the core, in submit order
	loadTks  []*Ticket // load tickets the group has not finished, in seq order (for WaitL1)
	vec      []int64   // the consensus vector (the core's and the driver's slots), reused by every Step
	calls    uint64    // replicated calls since the last Step (the vector carries it)
	watch    stepWatch // I/O pending with no Step
	done     core.Done // local completions, reused by every Step
	closed   bool
	stats    driverStats
	faults   faultState
}

type driverStats struct {
	collectives  int64
	latencies    []time.Duration // ring of recent consensus latencies
	next         int
	timed        int64    // consensus latencies recorded in all
	pagesCopied  [2]int64 // this rank's copies that completed, by kind
	transferErrs int64
	diverged     error
}

// New builds one rank's cache. It checks the scope first (see checkScope: an error naming
// both groups when a slab-group member is missing from the consensus group; a group that
// does not match the layout cannot be trusted to agree on anything). Then it builds the
// rank's core, engine and storage driver, and makes one AllReduce on the group that carries
// the configuration fingerprint and whether this rank failed: every rank learns at once
// whether all were configured alike and all could start. When some rank failed, every rank
// returns the same *StartError naming the lowest failing rank and its cause (broadcast from
// it), instead of the other ranks waiting for it until the deadline. Every rank of the group
// must call it. A scope error travels through that collective too (one rank given the wrong
// slab set fails every rank at once) when the consensus group is this rank's replica group;
// when the group itself is wrong, New returns at once: a collective on it could meet other
// ranks' unrelated calls. The same AllReduce compares the ranks' KV layouts (Config.KVLayout)
// first: when they differ, every rank gathers them and returns the same *LayoutMismatchError,
// whatever else failed (a rank given another model's layout often fails its own checks
// too, and the layout is the cause).
func New(ctx context.Context, cfg Config) (*Cache, error) {
	var c *Cache
	err := checkScope(cfg.Layout, cfg.Rank, cfg.Group, cfg.Slabs, cfg.ShareSlabs)
	if err != nil && !isReplicaGroup(cfg.Layout, cfg.Rank, cfg.Group) {
		return nil, err
	}
	if err == nil {
		c, err = build(cfg)
	}
	fp := int64(0)
	failed := int64(math.MaxInt64)
	if err != nil {
		failed = int64(cfg.Group.Rank())
	} else {
		fp = int64(c.core.Fingerprint() & (1<<63 - 1))
	}
	g := cfg.Group
	lh := kvLayoutHash(cfg.KVLayout)
	v := []int64{fp, -fp, failed, lh, -lh}
	if cerr := collective(ctx, cfg.StepTimeout, func(ctx context.Context) error { return g.AllReduce(ctx, parallel.Min, v) }); cerr != nil {
		return nil, errors.Join(fmt.Errorf("hicache: configuration check on group %s: %w", g.Name(), cerr), err, c.Close())
	}
	if v[3] != -v[4] {
		return nil, errors.Join(agreeKVLayout(ctx, cfg), c.Close())
	}
	if v[2] != math.MaxInt64 {
		return nil, errors.Join(agreeStartError(ctx, cfg, int(v[2]), err), c.Close())
	}
	c.stats.collectives++
	if v[0] != -v[1] {
		return nil, errors.Join(fmt.Errorf("%w: configuration differs across ranks of group %s (fingerprints %#x..%#x, this rank %#x)",
			ErrBadConfig, g.Name(), v[0], -v[1], fp), c.Close())
	}
	if g.Rank() == 0 && cfg.Layout.Coord(cfg.Rank).DP == 0 {
		c.warnSmallL2(cfg)
	}
	return c, nil
}

// warnSmallL2 logs a *SmallL2Warning when L2 holds no more pages than L1. New calls it on
// rank 0 of DP replica 0 only, so that a job warns once (cpcache's launchers give every
// replica the same sizes and compare them across ranks).
func (c *Cache) warnSmallL2(cfg Config) {
	cc := c.core.Config()
	if cc.PagesPerSlab > cc.L1Pages {
		return
	}
	w := &SmallL2Warning{L1Pages: cc.L1Pages, L2Pages: cc.PagesPerSlab, Slabs: cc.Slabs, Storage: cc.L3}
	if cfg.Log != nil {
		cfg.Log(w)
		return
	}
	log.Print(w)
}

// StartCauseLen bounds the cause text a failing rank sends in a start agreement (AgreeStart,
// and job.Open's agreements that name every failing rank).
const StartCauseLen = 1024

// agreeStartError broadcasts the cause of member failed's error from it and returns the
// error every rank reports (own is this rank's error, if it failed).
func agreeStartError(ctx context.Context, cfg Config, failed int, own error) error {
	g := cfg.Group
	cause := make([]byte, StartCauseLen)
	if failed == g.Rank() {
		copy(cause, own.Error())
	}
	var got []byte
	err := collective(ctx, cfg.StepTimeout, func(ctx context.Context) (err error) {
		got, err = g.Broadcast(ctx, failed, cause)
		return err
	})
	se := &StartError{Rank: g.Ranks()[failed], Group: g.Name(), Cause: string(bytes.TrimRight(got, "\x00")), Err: own}
	if err != nil {
		se.Cause = fmt.Sprintf("(its cause could not be learned: %v)", err)
	}
	return se
}

// build makes this rank's core, engine and storage driver: everything New does before the
// group agrees. On error it returns what it made, for the caller to close.
func build(cfg Config) (*Cache, error) {
	if cfg.StepTimeout < 0 || cfg.LatencySamples < 0 {
		return nil, fmt.Errorf("%w: step timeout %v and latency samples %d must not be negative", ErrBadConfig, cfg.StepTimeout, cfg.LatencySamples)
	}
	slabRanks := cfg.Slabs.Ranks()
	cc := core.Config{
		Options:      cfg.Options,
		Slabs:        len(slabRanks),
		PagesPerSlab: cfg.Slabs.PagesPerSlab(),
		CPRank:       slices.Index(slabRanks, cfg.Rank),
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%v|%d|%s", cfg.Group.Ranks(), cfg.Slabs.PageSize(), cfg.Layout)
	if cfg.ShareSlabs {
		if cfg.KVLayout == nil || !cfg.KVLayout.AllReplicated() {
			return nil, fmt.Errorf("%w: shared slabs need a KV layout whose every part is replicated across attention-TP (layout %v)", ErrBadConfig, cfg.KVLayout)
		}
		// The TP ranks of a CP index share its slab: their CP rank is the CP index.
		cc.CPRank = cfg.Layout.Coord(cfg.Rank).CP
		fmt.Fprint(h, "|shared-slabs")
	}
	l3opts := cfg.L3
	if cfg.Storage != nil {
		if cfg.StorageNamespace.IsZero() {
			return nil, fmt.Errorf("%w: storage %T given without its namespace (Config.StorageNamespace)", ErrBadConfig, cfg.Storage)
		}
		if err := l3opts.normalize(); err != nil {
			return nil, err
		}
		cc.L3, cc.L3Config = true, l3opts.coreConfig()
		fmt.Fprintf(h, "|l3|%s", l3opts.fingerprint())
	}
	if cfg.L1 != nil || cfg.L2Layout != 0 { // opaque-page configurations keep their fingerprint
		shape := "no L1"
		if cfg.L1 != nil {
			shape = cfg.L1.Shape().String()
		}
		fmt.Fprintf(h, "|l2=%d|l1=%s", cfg.L2Layout, shape)
	}
	cc.Fingerprint = h.Sum64()
	cr, err := core.New(cc)
	if err != nil {
		return nil, err
	}
	ccfg := cr.Config()
	if err := checkKVLayout(cfg.KVLayout, ccfg.PageSize, cfg.Layout.AttnTP, cfg.Slabs.PageSize()); err != nil {
		return nil, err
	}
	l2Layout, err := checkKVMem(cfg, ccfg.PageSize, ccfg.L1Pages)
	if err != nil {
		return nil, err
	}
	c := &Cache{
		group: cfg.Group, engine: cfg.Engine, timeout: cfg.StepTimeout, core: cr,
		maxSamples: cfg.LatencySamples, vec: make([]int64, vectorLen), cpRank: ccfg.CPRank,
		clearOnFlush: ccfg.L3 && l3opts.ClearOnFlush && ccfg.CPRank == 0, faults: faultState{f: cfg.Faults},
		readsSharedSlab: cfg.ShareSlabs && !cfg.Layout.SharedSlabWriter(cfg.Rank),
	}
	c.clearOnFlush = c.clearOnFlush && !c.readsSharedSlab
	c.watch.after, c.watch.log = cfg.StepWarnAfter, cfg.Log
	if c.watch.after == 0 {
		c.watch.after = DefaultStepWarnAfter
	}
	if c.maxSamples <= 0 {
		c.maxSamples = 1024
	}
	if c.engine == nil {
		hs, ok := cfg.Slabs.(HostSlabs)
		if !ok {
			return nil, fmt.Errorf("%w: slab set %T has no host pages; pass an Engine", ErrBadConfig, cfg.Slabs)
		}
		var he *hostengine.Engine
		if cfg.L1 != nil {
			he, err = hostengine.NewKV(hs, cfg.L1, l2Layout, cfg.HostEngine)
		} else {
			he, err = hostengine.New(hs, ccfg.L1Pages, cfg.Slabs.PageSize(), cfg.HostEngine)
		}
		if err != nil {
			return nil, err
		}
		c.engine, c.ownsEngine = he, true
	}
	c.l1mem, _ = c.engine.(L1Memory)
	if cfg.Events.Enabled {
		hub, err := newEventHub(cfg.Events, cfg.Layout.Coord(cfg.Rank).DP)
		if err != nil {
			return c, err
		}
		if cfg.Group.Rank() == 0 {
			c.events = hub
			cr.EnableEvents(true)
		}
	}
	if ccfg.L3 {
		hs, ok := cfg.Slabs.(HostSlabs)
		if !ok {
			return c, fmt.Errorf("%w: storage needs host slab pages; slab set %T has none", ErrBadConfig, cfg.Slabs)
		}
		if _, err := hs.Page(slab.Page{}); err != nil {
			return c, fmt.Errorf("%w: storage needs host slab pages: %w", ErrBadConfig, err)
		}
		shard := cfg.Layout.Coord(cfg.Rank).TP
		if cfg.ShareSlabs {
			shard = 0 // one copy of a replicated page for the whole TP group
		}
		c.l3 = newL3Driver(cfg.Storage, cfg.StorageNamespace, shard, hs, l3opts)
		c.l3.skip = c.readsSharedSlab
		if l2Layout == kvmem.LayerFirst {
			m, ok := hs.(engine.HostSlabMemory)
			if !ok {
				return c, fmt.Errorf("%w: a layer_first L2 with storage needs slabs with SlabMemory; %T has none", ErrBadConfig, cfg.Slabs)
			}
			shape, err := kvmem.NewShape(*cfg.KVLayout, cfg.Layout.AttnTP, ccfg.PageSize)
			if err != nil {
				return c, fmt.Errorf("%w: %w", ErrBadConfig, err)
			}
			c.l3.layerFirst = &layerFirstL2{shape: shape, mem: m}
		}
	}
	return c, c.faults.newError()
}

// collective runs f with the step timeout (0: the context's deadline, or the group's).
func collective(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return f(ctx)
}

// CPRank is this rank's index in its slab group.
func (c *Cache) CPRank() int { return c.cpRank }

// Owns reports whether this rank owns sequence page i (writes its KV in L1 and its backup).
func (c *Cache) Owns(i int) bool { return c.core.Owns(i) }

// L1Page returns the host memory of L1 slot s (only for engines with host L1, such as
// HostEngine).
func (c *Cache) L1Page(s int32) ([]byte, error) {
	if c.l1mem == nil {
		return nil, fmt.Errorf("%w: engine %T has no host L1 memory", ErrBadConfig, c.engine)
	}
	return c.l1mem.L1Page(s)
}

func (c *Cache) usable() error {
	if c == nil || c.closed {
		return ErrClosed
	}
	return nil
}

// replicable is usable for replicated calls, which may not overlap a Step's collective.
func (c *Cache) replicable() error {
	if err := c.usable(); err != nil {
		return err
	}
	if c.stepping {
		return errStepping
	}
	return nil
}

// startLocked starts the work the core handed out, before the step's Apply and by it:
// copies on the engine (a StepSubmitter gets them in one call), then this rank's storage
// jobs and stops. Only after the Apply that checked the state the work was chosen from
// (see Step).
func (c *Cache) startLocked(before, byApply core.Ready) {
	transfers := slices.Concat(before.Transfers, byApply.Transfers)
	var skipped []*Ticket
	if c.readsSharedSlab {
		transfers, skipped = skipSharedWrites(transfers)
	}
	var tks []*Ticket
	if ss, ok := c.engine.(StepSubmitter); ok && len(transfers) > 0 {
		tks = ss.SubmitStep(transfers)
	} else {
		for _, t := range transfers {
			tks = append(tks, c.engine.Submit(t))
		}
	}
	c.inflight = append(c.inflight, skipped...)
	for _, tk := range tks {
		c.inflight = append(c.inflight, tk)
		if tk.Transfer.Kind == Load {
			c.loadTks = append(c.loadTks, tk)
		}
	}
	if c.l3 != nil {
		for _, j := range slices.Concat(before.Jobs, byApply.Jobs) {
			c.l3.start(j)
		}
		for _, s := range slices.Concat(before.Stops, byApply.Stops) {
			c.l3.stop(s)
		}
	}
}

// reportLocked reports finished transfers and storage jobs to the core (local events).
func (c *Cache) reportLocked() {
	d := &c.done
	d.Transfers, d.Storage, d.Progress = d.Transfers[:0], d.Storage[:0], d.Progress[:0]
	keep := c.inflight[:0]
	for _, tk := range c.inflight {
		if !tk.Finished() {
			keep = append(keep, tk)
			continue
		}
		t, err := tk.Transfer, tk.Err()
		if err == nil {
			err = c.faults.copyError(t, c.core.NextStep())
		}
		if err != nil {
			c.stats.transferErrs++
		} else if !c.readsSharedSlab || t.Kind != Write {
			c.stats.pagesCopied[t.Kind] += int64(len(t.Copies))
		}
		d.Transfers = append(d.Transfers, core.TransferDone{Kind: t.Kind, Seq: t.Seq, Err: err})
	}
	clear(c.inflight[len(keep):])
	c.inflight = keep
	if c.l3 != nil {
		c.l3.poll(d)
		c.core.StorageCircuit(c.l3.brk.isOpen())
		c.core.StorageReadRate(c.l3.rate.get())
	}
	c.core.Report(*d)
}

// Match returns the longest prefix of r's tokens cached under r's isolation key (see
// Request and core.Core.Match). Replicated.
func (c *Cache) Match(r Request) (MatchResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return MatchResult{}, err
	}
	return c.core.Match(r), nil
}

// Insert caches the whole pages of r's tokens (see Core.Insert); the caller then writes the
// KV of the returned Fill pages it owns into their L1 slots, before the next Step: the
// backups the write policy asks for start at the beginning of the next Step. The pages are
// cached under r's isolation key: they match only a Match with the same key, and their L3
// keys are the key's. Replicated.
func (c *Cache) Insert(r Request) (InsertResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return InsertResult{}, err
	}
	res, err := c.core.Insert(r)
	return res, err
}

// Lock pins the prefix of node h against eviction. Replicated.
func (c *Cache) Lock(h Handle) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return err
	}
	return c.core.Lock(h)
}

// Unlock releases a Lock. Replicated.
func (c *Cache) Unlock(h Handle) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return err
	}
	return c.core.Unlock(h)
}

// EvictL1 frees L1 pages (see Core.EvictL1). Replicated.
func (c *Cache) EvictL1(pages int) (freed, pending int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return 0, 0, err
	}
	freed, pending = c.core.EvictL1(pages)
	return freed, pending, nil
}

// InsertSlots is Insert in L1 mode EngineOwned (Options.L1Mode): own are this rank's slots
// (from the engine's allocator, or Match's for device pages) for every whole page of r's
// tokens it owns, in order; see Core.InsertSlots. res.Freed are the slots the insert let go,
// for the engine's allocator. Replicated (each rank passes its own slots).
func (c *Cache) InsertSlots(r Request, own []int32) (InsertResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return InsertResult{}, err
	}
	return c.core.InsertSlots(r, own)
}

// LoadBackPlan lists the sequence pages this rank owns that a LoadBackSlots of node h would
// load at most, in order: LoadBackSlots wants one slot for each. Read-only.
func (c *Cache) LoadBackPlan(h Handle) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	return c.core.LoadBackPlan(h)
}

// LoadBackSlots is LoadBack in L1 mode EngineOwned: own are this rank's destination slots
// for the pages LoadBackPlan(h) lists; res.Freed are those not used (and slots the load's
// evictions freed), for the engine's allocator. Replicated.
func (c *Cache) LoadBackSlots(h Handle, own []int32) (LoadResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return LoadResult{}, err
	}
	return c.core.LoadBackSlots(h, own)
}

// EvictL1Slots is EvictL1 in L1 mode EngineOwned: it also returns this rank's slots freed
// now. Replicated.
func (c *Cache) EvictL1Slots(pages int) (freed, pending int, slots []int32, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return 0, 0, nil, err
	}
	return c.core.EvictL1Slots(pages)
}

// FreedL1 returns (and forgets) this rank's slots the cache let go outside a call that
// returns them (write-back evictions committing at a Step, quarantine, recovery, Flush):
// an EngineOwned engine drains it after every Step and hands them to its allocator. Nil in
// CacheOwned mode. Local.
func (c *Cache) FreedL1() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.core == nil {
		return nil
	}
	return c.core.TakeFreedL1()
}

// L1UsedBy is the number of CP rank r's L1 slots in use. The accounting is replicated
// (every rank knows every rank's pool, and it is in the digest), so an EngineOwned engine
// decides from it, identically on every rank, whether every rank's allocator has room for
// its pages before it allocates them (and evicts first when not). r outside 0..C-1 is an
// error wrapping ErrBadArgument. Read-only.
func (c *Cache) L1UsedBy(r int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return 0, err
	}
	if n := c.core.Config().Slabs; r < 0 || r >= n {
		return 0, fmt.Errorf("%w: L1UsedBy: CP rank %d outside 0..%d", ErrBadArgument, r, n-1)
	}
	return c.core.L1UsedBy(r), nil
}

// EvictL2 frees L2 pages of L2-only nodes. Replicated.
func (c *Cache) EvictL2(pages int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return 0, err
	}
	return c.core.EvictL2(pages), nil
}

// LoadBack starts loading the L2-only part of node h's prefix into L1 (see Core.LoadBack).
// Before a layer reads those pages, call WaitL1. Replicated.
func (c *Cache) LoadBack(h Handle) (LoadResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return LoadResult{}, err
	}
	res, err := c.core.LoadBack(h)
	return res, err
}

// WaitL1 blocks until this rank's copies of every load in flight on node h's prefix finished
// (a local wait: other ranks may still be copying their pages). Call it before a layer reads
// the prefix from L1, after the Step that follows the LoadBack (loads start only once that
// Step's Apply checked the state they were chosen from); before it, WaitL1 returns an error
// wrapping ErrNotStarted at once. A failed load returns its error here, on this rank only:
// the group agrees on it at the next step, which marks the node stale on every rank, so a
// scheduler must not act on this error alone — wait until LoadPending(h) is false and match
// again (every rank then sees the same, shorter hit). A handle that names no node returns
// a *core.StaleHandleError.
func (c *Cache) WaitL1(ctx context.Context, h Handle) error {
	wait, err := c.loadTickets(h)
	if err != nil {
		return err
	}
	for _, tk := range wait {
		select {
		case <-tk.Done():
			if err := tk.Err(); err != nil {
				return fmt.Errorf("hicache: load of node %d: %w", tk.Transfer.Node, err)
			}
		case <-ctx.Done():
			return fmt.Errorf("hicache: waiting for the load of node %d: %w", tk.Transfer.Node, ctx.Err())
		}
	}
	return nil
}

// LoadPending reports whether the group has not yet agreed that every load-back on node h's
// prefix is over. The loads start only at the next Step and are agreed over at a later one:
// a wait loop must step ("for c.LoadPending(h) { c.Step(ctx) }"), or it never ends. Once it is false, a load that failed on any rank has made its nodes stale
// on every rank, and Match of the same tokens gives every rank the same hit. A handle that
// names no node (evicted, from before a flush) has no load pending. Replicated.
func (c *Cache) LoadPending(h Handle) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchStepLocked()
	seqs, _ := c.core.Loading(h)
	return len(seqs) > 0
}

// Node returns a copy of the state of the node h names (see core.NodeInfo), or a
// *core.StaleHandleError when h names none. Local.
func (c *Cache) Node(h Handle) (NodeInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Node(h)
}

// Generation is the handle generation of the cache's current tree (see core.Handle): a
// later cache opened with Options.Generation at least this hands out no handle of this one.
func (c *Cache) Generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Generation()
}

// HintEvict asks, from this rank only, that the group evict pages at the next step (e.g.
// local memory pressure). Local.
func (c *Cache) HintEvict(l1, l2 int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.core.HintEvict(l1, l2)
}

// Step runs the consensus step: it reports finished transfers and storage jobs to the core,
// makes exactly one AllReduce(MIN) of the fixed-length vector on the group — every step,
// whether or not anything is pending — applies the agreed result, and only then starts the
// copies and storage jobs chosen since the last step (and by this Apply): nothing is written
// from a state the digests have not checked. Call it once per scheduler step on every rank:
// every rank the same number of times, with the same replicated calls between steps. The
// vector carries each rank's step ordinal and its count of replicated calls since its last
// step, so a rank whose extra Step met its peers' next one gets a DivergedError naming both
// counts (Cause); a Step that peers never join names their step counts when the group's
// backend knows them (parallel.NotArrivedError). Work pending longer than
// Config.StepWarnAfter with no Step is logged once and counted (Stats.NoStepWarnings).
//
// The mutex is not held during the collective: WaitL1, HintEvict and Stats answer at once
// even while a peer stalls; replicated calls made meanwhile (a second scheduler goroutine)
// fail with ErrBusy.
//
// A divergence returns a *DivergedError (wrapping ErrPlacementDiverged) on every rank at the
// same step: the work chosen since the last step is dropped, the transfers in flight are
// canceled and drained before Step returns (no slab byte is written afterwards), and the
// group is in quarantine (see core.Core.Quarantined) until the first step at which every rank
// is idle, which resets the cache on every rank at once. A collective failure (peer lost,
// timeout) returns the group's error; the group is then unusable.
func (c *Cache) Step(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicable(); err != nil {
		return err
	}
	defer c.events.publish(c.core) // what the scheduler's calls and this step changed
	c.reportLocked()
	step := c.core.NextStep()
	c.faults.beforeVector(c.core, step)
	rd := c.core.Ready()
	vec := c.vec
	c.core.Vector(vec[:core.VectorLen])
	c.fillSkewLocked(vec, step, c.calls)
	c.calls = 0
	c.steppedLocked()
	elapsed, err := c.collectiveUnlocked(ctx, func(ctx context.Context) error { return c.group.AllReduce(ctx, parallel.Min, vec) })
	c.recordLatency(elapsed)
	if err != nil {
		return c.stepError(step, err)
	}
	if c.closed {
		return ErrClosed
	}
	wasQuarantined := c.core.Quarantined()
	derr := c.core.Apply(vec[:core.VectorLen])
	switch {
	case derr != nil:
		var de *DivergedError
		if errors.As(derr, &de) {
			de.Cause = c.skewCause(vec)
		}
		c.stats.diverged = derr
		c.drainLocked()
		return derr
	case wasQuarantined && !c.core.Quarantined():
		c.stats.diverged = nil // recovered: everything was idle and is reset
		c.inflight, c.loadTks = nil, nil
	}
	c.startLocked(rd, c.core.Ready())
	// Loads the group has finished need no ticket any more.
	c.loadTks = slices.DeleteFunc(c.loadTks, func(tk *Ticket) bool {
		return tk.Finished() && !c.core.LoadInFlight(tk.Transfer.Seq)
	})
	return nil
}

// collectiveUnlocked runs f, a collective on the group, with c.mu released, so that local
// calls answer while a peer is slow; replicated calls made meanwhile fail (stepping). The
// caller holds c.mu and must check c.closed afterwards (Close may run meanwhile).
func (c *Cache) collectiveUnlocked(ctx context.Context, f func(context.Context) error) (time.Duration, error) {
	c.stats.collectives++
	c.stepping = true
	c.mu.Unlock()
	defer func() { c.mu.Lock(); c.stepping = false }() // also when f panics: the caller unlocks
	start := time.Now()
	err := collective(ctx, c.timeout, f)
	return time.Since(start), err
}

// errStepping: a replicated call while this rank's Step waits in its collective.
var errStepping = fmt.Errorf("%w: a replicated call (match, insert, lock, evict ...) was made while this rank's step waits for its peers: make the replicated calls from one scheduler thread per rank, between steps", ErrBusy)

// drainLocked cancels what has not started and waits for every transfer in flight.
func (c *Cache) drainLocked() {
	c.engine.Cancel()
	c.l3.drain()
	for _, tk := range c.inflight {
		<-tk.Done()
	}
	c.inflight = nil
	c.loadTks = nil
}

func (c *Cache) recordLatency(d time.Duration) {
	s := &c.stats
	s.timed++
	if len(s.latencies) < c.maxSamples {
		s.latencies = append(s.latencies, d)
		return
	}
	s.latencies[s.next] = d
	s.next = (s.next + 1) % c.maxSamples
}

// Pending is the number of backups, loads and storage operations in flight (replicated: equal on every rank, so
// a loop "step while Pending() > 0" makes the same number of steps everywhere).
func (c *Cache) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchStepLocked()
	return c.core.Pending()
}

// Idle reports whether Flush would be allowed (nothing in flight, nothing locked).
func (c *Cache) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Idle()
}

// Flush empties the cache: only when idle (no backup or load in flight, no lock held) —
// otherwise ErrBusy and nothing changes (idleness is replicated, so every rank refuses
// alike and no collective is made). Then a barrier on the group, and every rank resets the
// tree, L1 accounting, queues, hints and the L2 allocator (whose digest then equals a fresh
// one). L2 use resumes if a divergence had stopped it: in quarantine the replicas differ,
// idleness included, so the group agrees it instead (one AllReduce(MIN) in place of the
// barrier) and every rank refuses with ErrBusy, changing nothing, unless all are idle.
// Replicated.
func (c *Cache) Flush(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return err
	}
	defer c.events.publish(c.core) // the reset's EventCleared
	busy := c.core.Busy()
	agree, what := c.group.Barrier, "barrier"
	// In quarantine the collective is the group's MIN of "this rank is idle".
	idle := []int64{1}
	if c.core.Quarantined() { // replicated: entered and left at the same step everywhere
		if busy != nil {
			idle[0] = 0
		}
		agree = func(ctx context.Context) error { return c.group.AllReduce(ctx, parallel.Min, idle) }
		what = "agreement"
	} else if busy != nil {
		return busy
	}
	if _, err := c.collectiveUnlocked(ctx, agree); err != nil {
		return fmt.Errorf("hicache: flush %s on group %s: %w", what, c.group.Name(), err)
	}
	if c.closed {
		return ErrClosed
	}
	if idle[0] == 0 {
		if busy != nil {
			return busy
		}
		return fmt.Errorf("%w: a rank of group %s is not idle (in quarantine the replicas differ); flush needs every rank idle", ErrBusy, c.group.Name())
	}
	c.reportLocked()
	if c.clearOnFlush && c.core.Idle() {
		c.core.ForgetStorage() // the storage tier is cleared below
	}
	if err := c.core.Reset(); err != nil {
		return err
	}
	c.inflight = nil
	c.loadTks = nil
	c.stats.diverged = nil
	c.l3.drain() // idle: nothing runs; forget finished results
	if c.clearOnFlush {
		// A storage call like the others: bounded by the call deadline (c.mu is held).
		cctx, cancel := context.WithTimeout(ctx, c.l3.opts.CallTimeout)
		err := c.l3.st.Clear(cctx)
		cancel()
		if err != nil {
			c.l3.fail(fmt.Errorf("hicache: clearing storage on flush: %w", err))
		}
	}
	return nil
}

// Close cancels transfers that have not started, waits for running ones, and closes the
// engine if the cache made it. It does not close the group or the slabs. Nil-safe,
// idempotent.
func (c *Cache) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.drainLocked()
	c.events.closeSubs()
	if c.ownsEngine {
		return c.engine.Close()
	}
	return nil
}

// Prefetch asks L3 storage for the continuation of r's tokens beyond what the tree holds (see
// Core.Prefetch): the group agrees how much is stored, reserves L2 pages, every rank reads
// its own pages into its slab, and the agreed pages become an L2-only node; step until PrefetchPending(id) is
// false, then Match reports them as host pages. It reads only pages stored under r's
// isolation key, and inserts them under it. Replicated.
func (c *Cache) Prefetch(r Request) (PrefetchResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return PrefetchResult{}, err
	}
	res := c.core.Prefetch(r)
	return res, nil
}

// PrefetchPending reports whether prefetch id is still querying or reading. Replicated.
func (c *Cache) PrefetchPending(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchStepLocked()
	return c.core.PrefetchPending(id)
}

// PrefetchSkipsForCost reports whether Prefetch(r) would start nothing because reading
// the continuation is slower than computing it (L3Options.PrefetchCost; see
// core.PrefetchResult.CostSkipped), starting nothing. Replicated.
func (c *Cache) PrefetchSkipsForCost(r Request) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.PrefetchSkipsForCost(r)
}

// PrefetchOutcome returns how prefetch id ended (see Core.PrefetchOutcome): how many pages
// storage held, how many became an L2-only node, and why the others were refused or cut, so
// that a scheduler can retry a prefetch refused for want of room instead of computing what
// storage holds. False while it is pending and for an unknown id. Replicated.
func (c *Cache) PrefetchOutcome(id uint64) (PrefetchOutcome, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.PrefetchOutcome(id)
}

// PrefetchQuotaPages is the most L2 pages prefetches may hold reserved at once (see
// L3Options.PrefetchQuotaPages); 0 without L3.
func (c *Cache) PrefetchQuotaPages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := c.core.Config()
	if !cfg.L3 {
		return 0
	}
	return cfg.L3Config.PrefetchQuotaPages
}

// RevokePrefetch stops waiting for prefetch id (see Core.RevokePrefetch): under
// PrefetchBestEffort and PrefetchTimeout the next step inserts the prefix every rank has
// read of its own pages. Replicated.
func (c *Cache) RevokePrefetch(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.replicatedCall(); err != nil {
		return err
	}
	c.core.RevokePrefetch(id)
	return nil
}

// PrefetchWait is Prefetch followed by Steps until the prefetch is over: for a scheduler
// that fetches a request's prefix from storage before its prefill (then Match reports the
// fetched pages as host pages). It returns the first Step error (a *DivergedError
// included). Without L3, or when nothing was asked, it makes no Step. Replicated: every rank
// makes the same Steps.
func (c *Cache) PrefetchWait(ctx context.Context, r Request) (PrefetchResult, error) {
	res, err := c.Prefetch(r)
	if err != nil || res.ID == 0 {
		return res, err
	}
	for c.PrefetchPending(res.ID) {
		if err := c.Step(ctx); err != nil {
			return res, err
		}
	}
	return res, nil
}

// skipSharedWrites splits a reader's transfers (a rank that shares its slab and is not its
// writer): the loads it runs, and its backups as tickets finished at once without a copy —
// the writer copies the same pages into the one shared slab.
func skipSharedWrites(transfers []Transfer) (run []Transfer, done []*Ticket) {
	for _, t := range transfers {
		if t.Kind != Write {
			run = append(run, t)
			continue
		}
		tk := engine.NewTicket(t)
		tk.Finish(nil)
		done = append(done, tk)
	}
	return run, done
}
