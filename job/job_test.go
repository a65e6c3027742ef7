package job

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/storage"
)

// testGroups are an in-process rank's groups: its replica group (the consensus group).
type testGroups struct{ replica parallel.Group }

func (g testGroups) Group(kind parallel.GroupKind) parallel.Group {
	if kind == parallel.KindReplica {
		return g.replica
	}
	return nil
}

var testLayout = parallel.LayoutConfig{World: 4, AttnCP: 2}

// inProcess returns the configurations of the ranks of testLayout as goroutines: a local
// world, local replica groups and in-process slabs, each edited by edit (nil: none).
func inProcess(t *testing.T, edit func(rank int, c *Config)) []Config {
	t.Helper()
	l, err := parallel.NewLayout(testLayout)
	require.NoError(t, err)
	W := l.Config.World
	cfgs := make([]Config, W)
	worlds := local.World(W, local.Options{Timeout: 20 * time.Second, Kind: "world"})
	for _, ranks := range l.Groups(parallel.KindReplica) {
		for i, m := range local.New(ranks, local.Options{Timeout: 20 * time.Second, Kind: "replica"}) {
			cfgs[ranks[i]].Groups = testGroups{m}
		}
	}
	for _, ranks := range l.Groups(parallel.KindSlab) {
		ms := kvtest.NewMemSlabs(ranks, 16, 64)
		for _, r := range ranks {
			cfgs[r].Slabs = ms
		}
	}
	for r := range cfgs {
		c := &cfgs[r]
		c.World, c.Layout = worlds[r], testLayout
		c.PageTokens, c.PageBytes, c.L1Pages, c.L2Pages = 4, 64, 8, 16
		if edit != nil {
			edit(r, c)
		}
		t.Cleanup(func() { worlds[r].Close() })
	}
	return cfgs
}

// openAll opens every rank at once and returns each rank's Rank and error.
func openAll(t *testing.T, cfgs []Config) ([]*Rank, []error) {
	t.Helper()
	ranks, errs := make([]*Rank, len(cfgs)), make([]error, len(cfgs))
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ranks[r], errs[r] = Open(ctx, cfgs[r])
		})
	}
	wg.Wait()
	return ranks, errs
}

// TestOpenManyRanksInProcess: every rank opens its cache over in-process groups; Close
// closes it and is idempotent.
func TestOpenManyRanksInProcess(t *testing.T) {
	for round := range 3 {
		ranks, errs := openAll(t, inProcess(t, nil))
		for r, err := range errs {
			require.NoError(t, err, "round %d rank %d", round, r)
			rk := ranks[r]
			assert.Equal(t, r, rk.Rank())
			assert.Equal(t, "local", rk.Backend)
			assert.Equal(t, 4, rk.Layout.Config.World)
			assert.Nil(t, rk.Set, "the slabs were given")
			assert.Nil(t, rk.Storage)
			assert.Equal(t, rk.Layout.Coord(r).CP, rk.Cache.CPRank())
		}
		var wg sync.WaitGroup
		for _, rk := range ranks {
			wg.Go(func() {
				assert.NoError(t, rk.Close())
				assert.NoError(t, rk.Close(), "a second Close does nothing")
				_, err := rk.Cache.Match(hicache.Request{Tokens: []int32{1, 2, 3, 4}})
				assert.ErrorIs(t, err, hicache.ErrClosed, "Close closed the cache")
			})
		}
		wg.Wait()
	}
}

// TestCloseIsReverseAndJoinsErrors: what Open made is closed last first, each once, with
// every error joined.
func TestCloseIsReverseAndJoinsErrors(t *testing.T) {
	var order []string
	r := &Rank{}
	for _, name := range []string{"world", "groups", "slabs", "storage", "cache"} {
		r.onClose(func() error {
			order = append(order, name)
			if name == "slabs" || name == "cache" {
				return fmt.Errorf("closing %s failed", name)
			}
			return nil
		})
	}
	err := r.Close()
	assert.Equal(t, []string{"cache", "storage", "slabs", "groups", "world"}, order)
	assert.ErrorContains(t, err, "closing cache failed")
	assert.ErrorContains(t, err, "closing slabs failed")
	assert.NoError(t, r.Close())
	assert.Len(t, order, 5, "closed once")
	assert.NoError(t, (*Rank)(nil).Close())
}

// TestStorageKeyMismatchIsAgreed: one rank with another MAC key makes every rank fail with
// the same mismatch naming it.
func TestStorageKeyMismatchIsAgreed(t *testing.T) {
	url := "mem://job-test-" + t.Name()
	_, errs := openAll(t, inProcess(t, func(r int, c *Config) {
		c.StorageURL, c.StorageModel = url, "job-test"
		c.StorageOptions.MACKey = bytes.Repeat([]byte("a"), 32)
		if r == 2 {
			c.StorageOptions.MACKey = bytes.Repeat([]byte("b"), 32)
		}
	}))
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, ErrMismatch, "rank %d", r)
		assert.ErrorIs(t, err, storage.ErrBadArgument, "rank %d", r)
		assert.Contains(t, err.Error(), "different storage MAC keys", "rank %d", r)
		assert.Contains(t, err.Error(), "on rank 2", "rank %d", r)
		assert.Equal(t, errs[0].Error(), err.Error(), "every rank gives the same verdict")
	}
}

// TestStorageOpenFailureIsAgreed: a rank whose storage does not open makes every rank fail
// naming it and its cause.
func TestStorageOpenFailureIsAgreed(t *testing.T) {
	_, errs := openAll(t, inProcess(t, func(r int, c *Config) {
		c.StorageURL, c.StorageModel = "mem://job-test-"+t.Name(), "job-test"
		c.StorageOptions.Insecure = true
		if r == 1 {
			c.StorageURL = "ftp://nowhere/x"
			c.StorageError = func(err error) error { return fmt.Errorf("rank one's storage: %w", err) }
		}
	}))
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, hicache.ErrPeerFailed, "rank %d", r)
		assert.Contains(t, err.Error(), "rank 1 of group world[0..3] could not start: opening the storage: rank one's storage: ", "rank %d", r)
	}
	var se *hicache.StartError
	require.ErrorAs(t, errs[1], &se)
	assert.ErrorContains(t, errors.Unwrap(se.Err), `"ftp"`, "rank 1 wraps its own error")
}

// TestCUDAFailureIsAgreed: a rank whose CUDA driver does not load makes every rank fail at
// once, naming how many ranks failed, which, and why.
func TestCUDAFailureIsAgreed(t *testing.T) {
	t.Setenv("CPCACHE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
	_, errs := openAll(t, inProcess(t, func(r int, c *Config) {
		if r == 2 {
			c.L2, c.Device = L2Pinned, 0 // pinned host slabs need the driver
		}
	}))
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		var se *hicache.StartError
		require.ErrorAs(t, err, &se, "rank %d", r)
		assert.Equal(t, 2, se.Rank)
		assert.ErrorIs(t, err, hicache.ErrPeerFailed, "rank %d", r)
		assert.Contains(t, err.Error(), "rank 2 of group world[0..3] could not start: opening CUDA: failed on 1 of 4 ranks: rank 2: job: CUDA", "rank %d", r)
		assert.Contains(t, err.Error(), "/nonexistent/libcuda.so.1", "rank %d", r)
		assert.Equal(t, errs[0].Error(), err.Error(), "every rank gives the same verdict")
	}
	var le *cuda.LoadError
	assert.ErrorAs(t, errs[2], &le, "the failing rank wraps its own error")
}

// TestStorageClearFailureIsAgreed: a clear that fails on rank 0 stops every rank with its
// cause; a clear that works lets every rank open.
func TestStorageClearFailureIsAgreed(t *testing.T) {
	for _, fail := range []bool{false, true} {
		cleared := 0
		var mu sync.Mutex
		ranks, errs := openAll(t, inProcess(t, func(r int, c *Config) {
			c.StorageURL, c.StorageModel = fmt.Sprintf("mem://job-test-%s-%v", t.Name(), fail), "job-test"
			c.StorageOptions.Insecure = true
			c.ClearStorage = func(ctx context.Context, st storage.Storage) error {
				mu.Lock()
				cleared++
				mu.Unlock()
				if fail {
					return errors.New("the clear was refused")
				}
				return st.Clear(ctx)
			}
		}))
		assert.Equal(t, 1, cleared, "rank 0 alone clears")
		for r, err := range errs {
			if !fail {
				require.NoError(t, err, "rank %d", r)
				assert.NoError(t, ranks[r].Close())
				continue
			}
			require.Error(t, err, "rank %d", r)
			assert.Contains(t, err.Error(), "the clear was refused", "rank %d", r)
			if r > 0 {
				assert.Contains(t, err.Error(), "clearing the storage failed on rank 0", "rank %d", r)
			}
		}
	}
}

// TestBadConfigIsNamedBeforeAnyCollective: a bad value fails this rank at once, naming it,
// while the other ranks of its world never call Open (a collective would wait for them).
func TestBadConfigIsNamedBeforeAnyCollective(t *testing.T) {
	cases := map[string]func(*Config){
		"page bytes 0 must be positive":        func(c *Config) { c.PageBytes = 0 },
		"L1 pages -1":                          func(c *Config) { c.L1Pages = -1 },
		"L2 pages 0":                           func(c *Config) { c.L2Pages = 0 },
		"L1 kind 9":                            func(c *Config) { c.L1 = 9 },
		"device L2 slabs need a device L1":     func(c *Config) { c.L2 = L2Device },
		"CUDA device -1 is negative":           func(c *Config) { c.L2, c.Device = L2Pinned, -1 },
		"storage needs L2 pages in host":       func(c *Config) { c.L1, c.L2, c.StorageURL = L1Device, L2Device, "mem://x" },
		"a storage clear without a storage":    func(c *Config) { c.ClearStorage = func(context.Context, storage.Storage) error { return nil } },
		"an in-process world needs its groups": func(c *Config) { c.Groups = nil },
		"rank 4 outside world size 4":          func(c *Config) { c.World, c.Groups, c.Rank, c.Size = nil, nil, 4, 4 },
		"a caller's host L1 with a nil base":   func(c *Config) { c.L1 = L1Host },
		"both a rendezvous store URL (Store) and a store object (Rendezvous)": func(c *Config) {
			c.World, c.Groups, c.Rank, c.Size, c.Store, c.Rendezvous = nil, nil, 0, 4, "file:///tmp/x", parallel.NewMemStore()
		},
	}
	for want, edit := range cases {
		cfgs := inProcess(t, nil)
		edit(&cfgs[0])
		start := time.Now()
		_, err := Open(context.Background(), cfgs[0])
		require.ErrorIs(t, err, ErrBadValue, want)
		assert.Contains(t, err.Error(), want)
		assert.Less(t, time.Since(start), 5*time.Second, "%s: no rank waited for", want)
	}
}

// TestLayoutMustFitTheWorld: a layout for another world size is a bad value on every rank.
func TestLayoutMustFitTheWorld(t *testing.T) {
	_, errs := openAll(t, inProcess(t, func(_ int, c *Config) { c.Layout.World = 2 }))
	for r, err := range errs {
		require.ErrorIs(t, err, ErrBadValue, "rank %d", r)
		assert.Contains(t, err.Error(), "needs 2 ranks, the job has 4")
	}
}

// TestKVLayoutReachesTheCache: Open gives Config.KVLayout to the cache (one rank with
// another layout fails every rank naming the part), a layout that does not validate is a bad
// value before any collective, and equal layouts open.
func TestKVLayoutReachesTheCache(t *testing.T) {
	mk := func(s string) *kvlayout.Layout {
		l, err := kvlayout.Parse(s)
		require.NoError(t, err)
		return &l
	}
	// testLayout's pages: 4 tokens of 64 bytes at attention-TP 2.
	const fits = "layers=1;k=16:sharded;v=16:sharded"
	ranks, errs := openAll(t, inProcess(t, func(_ int, c *Config) { c.KVLayout = mk(fits) }))
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.NoError(t, ranks[r].Close())
	}
	_, errs = openAll(t, inProcess(t, func(r int, c *Config) {
		c.KVLayout = mk(fits)
		if r == 3 {
			c.KVLayout = mk("layers=1;k=16:sharded;v=16:replicated")
		}
	}))
	for r, err := range errs { // one replica group of all four ranks
		require.ErrorIs(t, err, hicache.ErrLayoutMismatch, "rank %d", r)
		assert.Contains(t, err.Error(), "rank 3 differs from rank 0's")
		assert.Contains(t, err.Error(), "part 1 (v): sharding sharded vs replicated")
	}
	cfgs := inProcess(t, nil)
	cfgs[0].KVLayout = &kvlayout.Layout{NumLayers: 1}
	_, err := Open(context.Background(), cfgs[0])
	require.ErrorIs(t, err, ErrBadValue)
	assert.ErrorIs(t, err, kvlayout.ErrBadLayout)
}

// TestL1BuffersReachTheCache: Config.L1Buffers become the cache's kvmem.L1 (at the layout's
// attention-TP size) with the L2 layout; one rank's bad buffer stops every rank, naming its
// layer and part; buffers need a layout and the cache's L1 kind.
func TestL1BuffersReachTheCache(t *testing.T) {
	l, err := kvlayout.Parse("layers=1;k=16:sharded;v=16:sharded") // 8 B a token a part at attention-TP 2
	require.NoError(t, err)
	bufs := func() []kvmem.Buffer {
		var out []kvmem.Buffer
		for j := range 2 {
			out = append(out, kvmem.Buffer{Layer: 0, Part: j, Host: make([]byte, 8*4*8), PageStride: 4 * 8, TokenStride: 8})
		}
		return out
	}
	ranks, errs := openAll(t, inProcess(t, func(_ int, c *Config) {
		c.KVLayout, c.L1Buffers, c.L2Layout = &l, bufs(), kvmem.LayerFirst
	}))
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		require.NotNil(t, ranks[r].KVL1)
		assert.Equal(t, 8, ranks[r].KVL1.Slots())
		assert.Equal(t, 2, ranks[r].KVL1.Shape().AttnTP())
		assert.Nil(t, ranks[r].HostEngine, "the cache's layered engine, not a pool's")
		assert.NoError(t, ranks[r].Close())
	}
	_, errs = openAll(t, inProcess(t, func(r int, c *Config) {
		c.KVLayout, c.L1Buffers = &l, bufs()
		if r == 2 {
			c.L1Buffers[1].Host = c.L1Buffers[1].Host[:8*4*7] // one slot short
		}
	}))
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "rank 2", "rank %d", r)
		assert.Contains(t, err.Error(), `layer 0 part 1 ("v"): 224 bytes, 8 slots need 256`, "rank %d", r)
	}
	cfgs := inProcess(t, nil)
	cfgs[0].L1Buffers = bufs()
	_, err = Open(context.Background(), cfgs[0])
	require.ErrorIs(t, err, ErrBadValue)
	assert.Contains(t, err.Error(), "L1 buffers without a KV layout")
	cfgs = inProcess(t, nil)
	cfgs[0].KVLayout, cfgs[0].L1Buffers, cfgs[0].L1 = &l, bufs(), L1HostAlloc
	_, err = Open(context.Background(), cfgs[0])
	require.ErrorIs(t, err, ErrBadValue)
	assert.Contains(t, err.Error(), "want L1Cache")
	// Device buffers (the engine's device memory: not touched before the CUDA step) take a
	// device L1 and no pool of its own; one kind of buffer per L1.
	devBufs := func() []kvmem.Buffer {
		out := bufs()
		for j := range out {
			out[j].Device, out[j].Host, out[j].Bytes = uintptr(0x1000*(j+1)), nil, 8*4*8
		}
		return out
	}
	for want, edit := range map[string]func(*Config){
		"L1 buffer of layer 0 part 1 is device memory, that of layer 0 part 0 host memory": func(c *Config) {
			c.L1Buffers = bufs()
			c.L1Buffers[1] = devBufs()[1]
		},
		"L1 buffers in device memory (layer 0 part 0) with L1 kind 0 (want L1Device":            func(c *Config) { c.L1Buffers = devBufs() },
		"L1 buffers in host memory (layer 0 part 0) with L1 kind 3 (they replace the pool":      func(c *Config) { c.L1Buffers, c.L1, c.L2 = bufs(), L1Device, L2Pinned },
		"L1 buffers in device memory (layer 0 part 0) and an L1 pool as well (L1Base or Device": func(c *Config) { c.L1Buffers, c.L1, c.L2, c.L1Base = devBufs(), L1Device, L2Pinned, unsafe.Pointer(c) },
		"L1 buffers in device memory (layer 0 part 0) and an L1 pool as well (L1Base or DeviceKVL1)": func(c *Config) {
			c.L1Buffers, c.L1, c.L2, c.DeviceKVL1 = devBufs(), L1Device, L2Pinned, true
		},
	} {
		cfgs = inProcess(t, nil)
		cfgs[0].KVLayout = &l
		edit(&cfgs[0])
		_, err = Open(context.Background(), cfgs[0])
		require.ErrorIs(t, err, ErrBadValue, want)
		assert.Contains(t, err.Error(), want)
	}
}

// TestReplicatedLayoutSharesSlabs: with a KV layout whose every part is replicated (MLA) at
// attention-TP 2, Open opens shared slabs over the replica group (2 slabs for 4 ranks, made
// by the TP-0 ranks) and the cache takes them; a per-TP slab set is then the wrong scope;
// SeparateSlabs keeps today's per-TP slabs.
func TestReplicatedLayoutSharesSlabs(t *testing.T) {
	mla, err := kvlayout.Parse("layers=1;latent=16:replicated") // 4 tokens × 16 B = testLayout's 64-byte page
	require.NoError(t, err)
	tag := fmt.Sprintf("jobshare%d", time.Now().UnixNano()%1e6)
	ranks, errs := openAll(t, inProcess(t, func(_ int, c *Config) {
		c.KVLayout, c.Slabs, c.Tag = &mla, nil, tag
	}))
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r, rk := range ranks {
		assert.True(t, rk.SharedSlabs, "rank %d", r)
		require.NotNil(t, rk.Set, "rank %d", r)
		assert.True(t, rk.Set.Shared())
		assert.Equal(t, []int{0, 2}, rk.Set.Ranks(), "rank %d: slabs made by the TP-0 ranks", r)
		assert.Equal(t, rk.Layout.Coord(r).CP, rk.Cache.CPRank())
		assert.Equal(t, map[int]int{0: 0, 2: 1, 1: -1, 3: -1}[r], rk.Set.Rank(), "rank %d's own slab", r)
	}
	for _, rk := range ranks {
		assert.NoError(t, rk.Close())
	}
	// The per-TP slab groups with a replicated layout: the cache's scope check refuses them.
	_, errs = openAll(t, inProcess(t, func(_ int, c *Config) { c.KVLayout = &mla }))
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		// Every rank's error names the cause (rank 1's scope error, agreed by New).
		assert.Contains(t, err.Error(), "slab group slab[1,3] of rank 1 is not the layout's slab group slab[0,2]", "rank %d", r)
	}
	// SeparateSlabs: today's per-TP slabs.
	ranks, errs = openAll(t, inProcess(t, func(_ int, c *Config) { c.KVLayout, c.SeparateSlabs = &mla, true }))
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.False(t, ranks[r].SharedSlabs)
		assert.NoError(t, ranks[r].Close())
	}
}

// TestKVL1ReachesTheCache: per-layer host L1 buffers and either L2 layout open (the cache
// builds its host engine over them), ranks choosing different L2 layouts fail every rank, and a per-layer
// L1 that does not fit the rest of the configuration is a bad value naming what differs:
// before any collective, or, for the attention-TP size only the layout knows, agreed by
// every rank.
func TestKVL1ReachesTheCache(t *testing.T) {
	const fits = "layers=2;k=8:sharded;v=8:sharded" // testLayout: 4 tokens of 64 bytes at attention-TP 2
	kv, err := kvlayout.Parse(fits)
	require.NoError(t, err)
	l1Over := func(kv kvlayout.Layout, attnTP, slots int) *kvmem.L1 {
		s, err := kvmem.NewShape(kv, attnTP, 4)
		require.NoError(t, err)
		l1, err := kvmem.NewL1(s, slots, kvmem.AllocTokenSlotBuffers(s, slots))
		require.NoError(t, err)
		return l1
	}
	l1Of := func(attnTP, slots int) *kvmem.L1 { return l1Over(kv, attnTP, slots) }
	for _, lay := range []kvmem.L2Layout{kvmem.PageFirst, kvmem.LayerFirst} {
		ranks, errs := openAll(t, inProcess(t, func(_ int, c *Config) { c.KVLayout, c.KVL1, c.L2Layout = &kv, l1Of(2, 8), lay }))
		for r, err := range errs {
			require.NoError(t, err, "%s: rank %d", lay, r)
			assert.Equal(t, lay, ranks[r].L2Layout)
			assert.NotNil(t, ranks[r].KVL1)
			assert.NoError(t, ranks[r].Close())
		}
	}
	_, errs := openAll(t, inProcess(t, func(r int, c *Config) {
		c.KVLayout, c.KVL1, c.L2Layout = &kv, l1Of(2, 8), kvmem.PageFirst
		if r == 2 {
			c.L2Layout = kvmem.LayerFirst
		}
	}))
	for r, err := range errs {
		assert.Error(t, err, "rank %d: another rank's L2 layout differs", r)
	}
	// A replicated layout's page takes 64 bytes at any attention-TP size: only the shape's
	// attention-TP differs from the layout's.
	repl, err := kvlayout.Parse("layers=1;k=8:replicated;v=8:replicated")
	require.NoError(t, err)
	_, errs = openAll(t, inProcess(t, func(_ int, c *Config) { c.KVLayout, c.KVL1 = &repl, l1Over(repl, 1, 8) }))
	for r, err := range errs { // agreed: rank 0's own error, its peers' naming it
		require.Error(t, err, "rank %d", r)
		assert.True(t, errors.Is(err, hicache.ErrPeerFailed), "rank %d: %v", r, err)
		assert.Equal(t, r == 0, errors.Is(err, ErrBadValue), "rank %d: %v", r, err)
		assert.Contains(t, err.Error(), "rank 0 of group world[0..3] could not start: making the copy engine: job: bad configuration value: the per-layer L1 is shaped for attention-TP 1, the layout")
	}
	other, err := kvlayout.Parse("layers=2;k=8:sharded;x=8:sharded")
	require.NoError(t, err)
	cases := map[string]func(*Config){
		"a layer_first L2 needs an L1 of per-layer buffers":                       func(c *Config) { c.KVL1, c.L2Layout = nil, kvmem.LayerFirst },
		"L2 layout 7 (want page_first or layer_first)":                            func(c *Config) { c.L2Layout = 7 },
		"needs its KV layout (KVLayout)":                                          func(c *Config) { c.KVLayout = nil },
		"the per-layer L1 has 4 page slots, L1Pages is 8":                         func(c *Config) { c.KVL1 = l1Of(2, 4) },
		"the per-layer L1 buffers are in host memory":                             func(c *Config) { c.L1, c.L2 = L1Device, L2Pinned },
		"needs L1 kind L1Cache (host buffers) or L1Device":                        func(c *Config) { c.L1 = L1HostAlloc },
		"the per-layer L1 has 4-token pages, PageTokens is 8":                     func(c *Config) { c.PageTokens = 8 },
		"a page of the per-layer L1 takes 64 bytes, PageBytes":                    func(c *Config) { c.PageBytes = 128 },
		"the per-layer L1's layout differs from KVLayout: part":                   func(c *Config) { c.KVLayout = &other },
		"per-layer device L1 buffers need a device L1 (L1Device) and a KV layout": func(c *Config) { c.DeviceKVL1, c.KVL1 = true, nil },
		"per-layer device L1 buffers Open allocates, and the caller's L1 as well": func(c *Config) { c.DeviceKVL1, c.L1, c.L2 = true, L1Device, L2Pinned },
	}
	for want, edit := range cases {
		cfgs := inProcess(t, func(_ int, c *Config) { c.KVLayout, c.KVL1 = &kv, l1Of(2, 8) })
		edit(&cfgs[0])
		start := time.Now()
		_, err := Open(context.Background(), cfgs[0])
		require.ErrorIs(t, err, ErrBadValue, want)
		assert.Contains(t, err.Error(), want)
		assert.Less(t, time.Since(start), 5*time.Second, "%s: no rank waited for", want)
	}
}

// TestOpenThroughTheCallersStore: the ranks of a Gloo world meet through a store the caller
// runs (Rendezvous) under their job id, and a second job with another id on the same store
// at the same time forms its own world.
func TestOpenThroughTheCallersStore(t *testing.T) {
	st := parallel.NewMemStore()
	var cfgs []Config
	for _, job := range []string{"a", "b"} {
		ms := kvtest.NewMemSlabs([]int{0, 1}, 16, 64)
		for r := range 2 {
			cfgs = append(cfgs, Config{Rendezvous: st, JobID: job, Rank: r, Size: 2, LocalSize: 2, Timeout: 20 * time.Second,
				Layout: parallel.LayoutConfig{World: 2, AttnCP: 2}, Slabs: ms, Consensus: "gloo",
				PageTokens: 4, PageBytes: 64, L1Pages: 8, L2Pages: 16})
		}
	}
	ranks, errs := openAll(t, cfgs)
	for i, err := range errs {
		require.NoError(t, err, "job %d rank %d", i/2, i%2)
	}
	for i, rk := range ranks {
		assert.Equal(t, i%2, rk.Rank())
		assert.Equal(t, 2, rk.World.Size())
		assert.NoError(t, rk.Close())
	}
}
