package job

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// Errors of Open that are the job's input rather than a failure of a rank.
var (
	// ErrBadValue is wrapped by errors naming a value of Config no rank could use (checked
	// before any collective) or that does not fit the job (the layout's world against the
	// job's, an unknown consensus backend).
	ErrBadValue = errors.New("job: bad configuration value")
	// ErrMismatch is wrapped by errors naming ranks that disagree on what must be alike
	// (the storage and its MAC key). They also wrap storage.ErrBadArgument.
	ErrMismatch = errors.New("job: ranks disagree")
)

// L1Kind is where the L1 pool of a rank lives.
type L1Kind int

// L1 kinds.
const (
	L1Cache     L1Kind = iota // host memory the cache allocates (hicache's own HostEngine)
	L1HostAlloc               // anonymous host memory Open maps (outside the Go heap: its address may go to C)
	L1Host                    // the caller's host memory at L1Base
	L1Device                  // device memory: the caller's at L1Base, or a pool Open allocates when L1Base is nil
)

// L2Kind is the memory of a rank's L2 slab.
type L2Kind int

// L2 kinds.
const (
	L2Host   L2Kind = iota // host shared memory
	L2Pinned               // host shared memory registered with CUDA (its device pointers address it)
	L2Device               // device memory shared over CUDA IPC
)

// Groups is a rank's group of each kind of its layout (gloo.LayoutGroups, or in-process groups).
type Groups interface {
	Group(kind parallel.GroupKind) parallel.Group
}

// Config is one rank's configuration: plain values, and hooks for what only the caller knows.
type Config struct {
	// World, with Groups, is an in-process world (local groups): Open makes no Gloo world
	// and closes neither. Nil: a Gloo world over Store, placed by Rank and Size.
	World  parallel.Group
	Groups Groups // with World: this rank's groups (Consensus uses KindReplica; KindSlab unless Slabs is set)
	Store  string // rendezvous store URL ("": CPCACHE_STORE)
	// Rendezvous is a store the caller runs (an engine's torch.distributed.Store) to meet
	// through instead of a URL (gloo.Options.Rendezvous). Not with Store.
	Rendezvous parallel.Store
	// JobID tells this job's ranks from another job's on the same store ("": CPCACHE_JOB_ID or
	// the launcher's; gloo.Options.JobID).
	JobID string
	// LocalSize is the number of this job's ranks on this machine, with Size (0: unknown).
	LocalSize int
	// StoreArg names the store argument of the API in use in the error of a world without a
	// store (gloo.Options.StoreArg).
	StoreArg string
	Rank     int // with Size > 0: this rank (else the launcher's environment)
	Size     int // world size (0: the launcher's environment)
	// Timeout bounds rendezvous and every collective of the world (0: parallel.DefaultTimeout).
	Timeout time.Duration
	// StepTimeout bounds each consensus step (0: the context's deadline, or the group's).
	StepTimeout time.Duration
	// StepWarnAfter is hicache.Config.StepWarnAfter (0: CPCACHE_STEP_WARN_MS milliseconds
	// when set, else hicache.DefaultStepWarnAfter; negative: never warn).
	StepWarnAfter time.Duration
	// Start, if set, is the first agreement over the world, before any group is made: every
	// rank calls it (a comparison of the ranks' settings; a host-memory check). It may set
	// what the agreement decides in opts, the cache's options (libcpcache: the first handle
	// generation, above every rank's closed sessions').
	Start func(ctx context.Context, world parallel.Group, opts *hicache.Options) error
	// BeforeSlabs, if set, is called just before the slabs are opened (fault injection).
	BeforeSlabs func()

	Layout     parallel.LayoutConfig // World 0: the world's size
	PageTokens int                   // tokens per page
	PageBytes  int                   // bytes of one page of one rank
	L1Pages    int                   // L1 pages of this rank
	L2Pages    int                   // L2 pages of each slab
	Options    hicache.Options       // the cache's options (PageSize and L1Pages come from above)
	Consensus  string                // consensus backend: "", auto, shm or gloo (see parallel/shm)
	// KVLayout is the shape of the engine's KV memory (hicache.Config.KVLayout; nil: opaque
	// pages). When set, a page of PageTokens tokens at the layout's attention-TP size takes
	// PageBytes, every rank gives an equal one, and its fingerprint joins the storage
	// namespace.
	KVLayout *kvlayout.Layout
	// SeparateSlabs keeps one slab per rank even for a KVLayout whose every part is
	// replicated across attention-TP (see SharesSlabs): attention-TP copies of every page in
	// L2, as before slabs were shared.
	SeparateSlabs bool
	// KVL1, when set, is the engine's KV memory as per-(layer, part) buffers of KVLayout
	// (kvmem.NewL1, at the layout's attention-TP size and PageTokens tokens, at least L1Pages
	// slots) instead of a flat pool of opaque pages: host buffers with L1 L1Cache (the cache's
	// default host engine copies between them and the slabs, hicache.Config.L1), device buffers
	// with L1 L1Device (cudaengine.NewKV over them; Open allocates no pool). Nil: a flat pool.
	KVL1 *kvmem.L1
	// DeviceKVL1, with L1 L1Device, KVLayout and no KVL1 or L1Base: Open allocates the L1 on
	// the device as SGLang-style token-slot buffers, one per layer and part of L1Pages page
	// slots (Rank.KVL1), instead of one pool of whole pages.
	DeviceKVL1 bool
	// L1Buffers, when set, is the engine's L1 as per-(layer, part) buffers lent by the
	// caller (kvmem.Buffer, KVLayout set), all host memory (L1 L1Cache: the cache's host
	// engine) or all device memory (L1 L1Device, no L1Base: cudaengine.NewKV over them, as
	// with a device KVL1): Open builds KVL1 (kvmem.NewL1 of L1Pages slots) over them once the
	// layout's attention-TP size is known, in the agreed engine step (a bad buffer stops
	// every rank, naming its layer and part): for callers (libcpcache) that cannot know the
	// attention-TP size before the world is joined. Not with KVL1.
	L1Buffers []kvmem.Buffer
	// L2Layout is how the slabs arrange a page's chunks (hicache.Config.L2Layout; 0 is
	// kvmem.PageFirst). LayerFirst needs KVL1 or L1Buffers. Agreed by every rank in hicache.New.
	L2Layout kvmem.L2Layout

	L1     L1Kind
	L1Base unsafe.Pointer // L1Host, L1Device: the caller's pool of L1Pages × PageBytes
	L2     L2Kind
	// Device is the CUDA device ordinal (L1Device, L2Pinned, L2Device). PickDevice, if set,
	// chooses it instead from the node's device count.
	Device     int
	PickDevice func(count int) (int, error)
	// OnDevice, if set, prepares what the caller needs on the device (a staging page) as part
	// of the agreed CUDA step; the returned close runs in Close before the device is released.
	OnDevice func(dev *cuda.Device) (closeFn func() error, err error)
	// WrapEngine, if set, wraps a copy engine Open makes (timing its copies).
	WrapEngine func(hicache.Engine) hicache.Engine
	// Slabs is a pre-built L2 (in-process slabs): no slab set is opened.
	Slabs      hicache.SlabSet
	Tag        string // the slabs' segment-name tag
	SlabLayout string // the page layout the slab group compares

	// L3 storage: StorageURL "" is none. Every rank opens its own handle in the namespace of
	// StorageModel and KVLayout (hicache.NewStorageNamespace) with StorageOptions (Namespace
	// is set here).
	StorageURL     string
	StorageModel   string
	StorageOptions storage.Options
	StorageTimeout time.Duration // bounds opening the storage and its clear (0: the context's)
	// StorageError, if set, rewrites this rank's error opening the storage (a hint, a
	// redacted URL) before it is agreed.
	StorageError func(error) error
	// WrapStorage, if set, wraps the storage after the key agreement (faults of the store).
	WrapStorage func(storage.Storage) storage.Storage
	// ClearStorage, if set, clears the storage on rank 0 before any cache reads it; its
	// outcome is agreed.
	ClearStorage func(ctx context.Context, st storage.Storage) error
	L3           hicache.L3Options

	// Events are the cache's event options (hicache.Config.Events); zero with a KVEvents
	// endpoint takes KVEvents.EventOptions().
	Events hicache.EventOptions
	// KVEvents publishes each replica's KV events in vLLM's format (hicache/kvevents): its
	// leader (the first rank of its replica group) runs a kvevents.ReplicaPublisher on the
	// endpoints numbered for its replica (Rank.Events). Every rank gives the same; Endpoint ""
	// publishes nothing. Its endpoints are checked before any collective (ErrBadValue naming
	// them; the last replica's numbering once the layout is known) and the publisher's start
	// is agreed by every rank.
	KVEvents kvevents.Config
	// KVEventsLog receives the publisher's background errors (nil: standard error, naming the
	// rank).
	KVEventsLog func(error)
	// MetricsAddr, if set, is a TCP address (host:port) where this rank serves Rank.Metrics
	// and this process's Go and process collectors on /metrics over HTTP until Close. It is
	// listened on before any collective (a bad or busy address is ErrBadValue naming it).
	MetricsAddr    string
	Faults         *hicache.Faults
	LatencySamples int
}

// usesCUDA reports whether the rank needs the CUDA driver.
func (c *Config) usesCUDA() bool { return c.L1 == L1Device || c.L2 != L2Host }

// check rejects values no rank could use, naming them, before any collective.
func (c *Config) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadValue}, args...)...)
	}
	switch {
	case c.World != nil && c.Groups == nil:
		return bad("an in-process world needs its groups")
	case c.World == nil && c.Groups != nil:
		return bad("groups without their world")
	case c.Store != "" && c.Rendezvous != nil:
		return bad("both a rendezvous store URL (Store) and a store object (Rendezvous): give one")
	case c.World != nil && c.Rendezvous != nil:
		return bad("a rendezvous store (Rendezvous) with an in-process world")
	case c.LocalSize < 0 || c.Size > 0 && c.LocalSize > c.Size:
		return bad("local size %d outside 0..world size %d", c.LocalSize, c.Size)
	case c.Size < 0:
		return bad("world size %d is negative", c.Size)
	case c.Size > 0 && (c.Rank < 0 || c.Rank >= c.Size):
		return bad("rank %d outside world size %d", c.Rank, c.Size)
	case c.Layout.World < 0:
		return bad("layout world %d is negative", c.Layout.World)
	case c.PageTokens <= 0:
		return bad("page tokens %d must be positive", c.PageTokens)
	case c.PageBytes <= 0:
		return bad("page bytes %d must be positive", c.PageBytes)
	case c.L1Pages <= 0 || c.L1Pages > math.MaxInt32:
		return bad("L1 pages %d must be in 1..2^31-1", c.L1Pages)
	case c.L2Pages <= 0 || c.L2Pages > math.MaxInt32:
		return bad("L2 pages %d must be in 1..2^31-1", c.L2Pages)
	case c.L1Pages > math.MaxInt/c.PageBytes || c.L2Pages > math.MaxInt/c.PageBytes:
		return bad("%d pages of %d bytes overflow", max(c.L1Pages, c.L2Pages), c.PageBytes)
	case c.L1 < L1Cache || c.L1 > L1Device:
		return bad("L1 kind %d", int(c.L1))
	case c.L2 < L2Host || c.L2 > L2Device:
		return bad("L2 kind %d", int(c.L2))
	case c.L1 == L1Host && c.L1Base == nil:
		return bad("a caller's host L1 with a nil base")
	case c.L2 == L2Device && c.L1 != L1Device:
		return bad("device L2 slabs need a device L1")
	case c.L1 == L1Device && c.L2 == L2Host:
		return bad("a device L1 needs pinned host or device L2 slabs (copies reach them through device pointers)")
	case c.usesCUDA() && c.PickDevice == nil && c.Device < 0:
		return bad("CUDA device %d is negative", c.Device)
	case c.StorageURL != "" && c.L2 == L2Device:
		return bad("storage needs L2 pages in host memory")
	case c.StorageURL == "" && c.ClearStorage != nil:
		return bad("a storage clear without a storage")
	case c.Timeout < 0 || c.StepTimeout < 0 || c.StorageTimeout < 0:
		return bad("negative timeout (%v, step %v, storage %v)", c.Timeout, c.StepTimeout, c.StorageTimeout)
	}
	var ce *kvevents.ConfigError
	if err := c.KVEvents.Check(1); errors.As(err, &ce) {
		return bad("KV events %s %q: %v", ce.Field, ce.Value, ce.Err)
	} else if err != nil {
		return bad("KV events: %v", err)
	}
	switch {
	case len(c.L1Buffers) > 0 && c.KVLayout == nil:
		return bad("L1 buffers without a KV layout")
	case len(c.L1Buffers) > 0 && c.KVL1 != nil:
		return bad("both L1 buffers and a KVL1: give one")
	}
	if err := c.checkL1Buffers(bad); err != nil {
		return err
	}
	if c.KVLayout != nil {
		if err := c.KVLayout.Validate(); err != nil {
			return fmt.Errorf("%w: KV layout: %w", ErrBadValue, err)
		}
	}
	return c.checkKVL1(bad)
}

// checkL1Buffers rejects L1Buffers of both memory kinds, or of a kind the L1 kind does not
// take (host buffers: L1Cache; device buffers: L1Device, without an L1Base pool), naming the
// first buffer that differs by its layer and part.
func (c *Config) checkL1Buffers(bad func(format string, args ...any) error) error {
	if len(c.L1Buffers) == 0 {
		return nil
	}
	first := c.L1Buffers[0]
	device := first.Device != 0
	for _, b := range c.L1Buffers[1:] {
		if (b.Device != 0) != device {
			return bad("L1 buffer of layer %d part %d is %s memory, that of layer %d part %d %s memory: give buffers of one kind",
				b.Layer, b.Part, memoryName(b.Device != 0), first.Layer, first.Part, memoryName(device))
		}
	}
	switch {
	case !device && c.L1 != L1Cache:
		return bad("L1 buffers in host memory (layer %d part %d) with L1 kind %d (they replace the pool: want L1Cache)", first.Layer, first.Part, int(c.L1))
	case device && c.L1 != L1Device:
		return bad("L1 buffers in device memory (layer %d part %d) with L1 kind %d (want L1Device: the CUDA engine copies between them and the slabs)", first.Layer, first.Part, int(c.L1))
	case device && (c.L1Base != nil || c.DeviceKVL1):
		return bad("L1 buffers in device memory (layer %d part %d) and an L1 pool as well (L1Base or DeviceKVL1): give one", first.Layer, first.Part)
	}
	return nil
}

// checkKVL1 rejects a per-layer L1 or an L2 layout that does not fit the rest of c, naming
// what differs, before any collective (the attention-TP size, known once the layout is
// built, is checked with the engine: makeEngine).
func (c *Config) checkKVL1(bad func(format string, args ...any) error) error {
	if c.L2Layout != 0 && !c.L2Layout.Valid() {
		return bad("L2 layout %d (want %s or %s)", int(c.L2Layout), kvmem.PageFirst, kvmem.LayerFirst)
	}
	if c.DeviceKVL1 {
		switch {
		case c.L1 != L1Device || c.KVLayout == nil:
			return bad("per-layer device L1 buffers need a device L1 (L1Device) and a KV layout")
		case c.KVL1 != nil || c.L1Base != nil:
			return bad("per-layer device L1 buffers Open allocates, and the caller's L1 as well")
		}
		return nil
	}
	if c.KVL1 == nil {
		if c.L2Layout == kvmem.LayerFirst && len(c.L1Buffers) == 0 {
			return bad("a %s L2 needs an L1 of per-layer buffers (KVL1 or L1Buffers)", kvmem.LayerFirst)
		}
		return nil
	}
	s := c.KVL1.Shape()
	switch {
	case c.KVLayout == nil:
		return bad("an L1 of per-layer buffers (%s) needs its KV layout (KVLayout)", s)
	case c.L1 != L1Cache && c.L1 != L1Device:
		return bad("an L1 of per-layer buffers needs L1 kind L1Cache (host buffers) or L1Device (device buffers), not %d", int(c.L1))
	case c.KVL1.Device() != (c.L1 == L1Device):
		return bad("the per-layer L1 buffers are in %s memory, the L1 kind %d needs %s memory", memoryName(c.KVL1.Device()), int(c.L1), memoryName(c.L1 == L1Device))
	case c.L1Base != nil:
		return bad("an L1 of per-layer buffers with an L1Base pool as well")
	case c.KVL1.Slots() < c.L1Pages:
		return bad("the per-layer L1 has %d page slots, L1Pages is %d", c.KVL1.Slots(), c.L1Pages)
	case s.PageTokens() != c.PageTokens:
		return bad("the per-layer L1 has %d-token pages, PageTokens is %d", s.PageTokens(), c.PageTokens)
	case s.PageBytes() != int64(c.PageBytes):
		return bad("a page of the per-layer L1 takes %d bytes, PageBytes is %d", s.PageBytes(), c.PageBytes)
	}
	if d := s.Layout().Diff(*c.KVLayout); d != "" {
		return bad("the per-layer L1's layout differs from KVLayout: %s", d)
	}
	return nil
}

// SharesSlabs reports whether the ranks of a job with parallel layout l and KV layout kv
// share slabs (hicache.Config.ShareSlabs): every part of kv is replicated across
// attention-TP (MLA), attention-TP is above 1, and separate is not set
// (Config.SeparateSlabs). The attention-TP ranks of a CP index then share one slab, made by
// the TP-index-0 rank (parallel.Layout.SharedSlabGroup): one L2 copy per CP group instead of
// attention-TP copies.
func SharesSlabs(l *parallel.Layout, kv *kvlayout.Layout, separate bool) bool {
	return !separate && l != nil && l.AttnTP > 1 && kv != nil && kv.AllReplicated()
}

func memoryName(device bool) string {
	if device {
		return "device"
	}
	return "host"
}
