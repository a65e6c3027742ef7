package hicache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/parallel"
)

// layerEngine finishes backups at once and holds every load, with a layered ticket of
// `layers` layers, until the test lands its layers (finishLayer) or finishes it.
type layerEngine struct {
	layers int
	mu     sync.Mutex
	loads  []*Ticket // held loads, in submit order
}

func (e *layerEngine) Submit(t Transfer) *Ticket {
	tk := engine.NewLayeredTicket(t, e.layers)
	if t.Kind != Load {
		tk.Finish(nil)
		return tk
	}
	e.mu.Lock()
	e.loads = append(e.loads, tk)
	e.mu.Unlock()
	return tk
}

// Cancel finishes the held loads: none has started copying.
func (e *layerEngine) Cancel() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, tk := range e.loads {
		tk.Finish(ErrCanceled)
	}
	e.loads = nil
}

func (e *layerEngine) Close() error { e.Cancel(); return nil }

// load is the one held load (the test fails when there is not exactly one).
func (e *layerEngine) load(t *testing.T) *Ticket {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.loads) != 1 {
		t.Fatalf("%d loads submitted, want 1", len(e.loads))
	}
	return e.loads[0]
}

// streamEngine is a layerEngine with stream waits: it records each WaitLayerOn call.
type streamEngine struct {
	layerEngine
	waits []streamWait
}

type streamWait struct {
	tk     *Ticket
	layer  int
	stream uintptr
}

func (e *streamEngine) WaitLayerOn(tk *Ticket, layer int, stream uintptr) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waits = append(e.waits, streamWait{tk, layer, stream})
	return nil
}

// hostHit builds a one-rank cache over eng, caches a 4-page sequence, backs it up, drops it
// from L1 and starts its load-back: it returns the handle to wait on, with the load chosen
// but not started (the next Step starts it).
func hostHit(t *testing.T, eng Engine) (*rig, Handle) {
	t.Helper()
	r := newRig(t, rigConfig{
		layout: parallel.LayoutConfig{World: 1, AttnCP: 1}, opts: Options{PageSize: 4, L1Pages: 16},
		pagesPerSlab: 16, pageBytes: 64, engine: func(int) Engine { return eng },
	})
	c := r.caches[0]
	tokens := tokensN(100, 16)
	if _, err := c.Insert(Request{Tokens: tokens}); err != nil {
		t.Fatal(err)
	}
	evictL1All(t, r)
	m, err := c.Match(Request{Tokens: tokens})
	if err != nil || m.HostPages != 4 {
		t.Fatalf("match after eviction: %+v, %v; want 4 host pages", m, err)
	}
	if res, err := c.LoadBack(m.Last); err != nil || res.Pages != 4 {
		t.Fatalf("load-back: %+v, %v; want 4 pages", res, err)
	}
	return r, m.Last
}

// waitBriefly is WaitL1Layer bounded by a short deadline: DeadlineExceeded means the layer
// has not landed.
func waitBriefly(c *Cache, h Handle, layer int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	return c.WaitL1Layer(ctx, h, layer)
}

// TestWaitL1LayerReturnsPerLayer: a layer's wait returns once that layer of the load landed,
// while the later layers are still copying (their waits, and WaitL1, are bounded by the
// context); before the Step that starts the load it fails with ErrNotStarted.
func TestWaitL1LayerReturnsPerLayer(t *testing.T) {
	eng := &layerEngine{layers: 4}
	r, h := hostHit(t, eng)
	c := r.caches[0]
	if err := c.WaitL1Layer(context.Background(), h, 0); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("WaitL1Layer before the load's Step: %v, want ErrNotStarted", err)
	}
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	tk := eng.load(t)
	if err := waitBriefly(c, h, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("layer 0 before it landed: %v, want the context's deadline", err)
	}
	layer1 := make(chan error, 1)
	go func() { layer1 <- c.WaitL1Layer(context.Background(), h, 1) }()

	tk.FinishLayer(0)
	if err := c.WaitL1Layer(context.Background(), h, 0); err != nil {
		t.Fatalf("layer 0 after it landed: %v", err)
	}
	if err := waitBriefly(c, h, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("layer 1 while it is copying: %v, want the context's deadline", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.WaitL1(ctx, h); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitL1 with layers 1..3 copying: %v, want the context's deadline", err)
	}
	select {
	case err := <-layer1:
		t.Fatalf("the wait for layer 1 returned (%v) before layer 1 landed", err)
	default:
	}

	tk.FinishLayer(2)
	if err := <-layer1; err != nil {
		t.Fatalf("the wait for layer 1, once layers 0..2 landed: %v", err)
	}
	if err := c.WaitL1Layer(context.Background(), h, 2); err != nil {
		t.Fatalf("layer 2 after it landed: %v", err)
	}
	if err := waitBriefly(c, h, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("layer 3 while it is copying: %v, want the context's deadline", err)
	}
	tk.Finish(nil)
	for layer := range 4 {
		if err := c.WaitL1Layer(context.Background(), h, layer); err != nil {
			t.Fatalf("layer %d of a finished load: %v", layer, err)
		}
	}
	if err := c.WaitL1(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	for c.LoadPending(h) {
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitL1Layer(context.Background(), h, 3); err != nil {
		t.Fatalf("after the group agreed the load is over: %v", err)
	}
}

// TestWaitL1LayerErrors: a bad layer and a stale handle are refused at once; a load that
// failed after its first layer landed returns its error for every layer, on this rank.
func TestWaitL1LayerErrors(t *testing.T) {
	eng := &layerEngine{layers: 4}
	r, h := hostHit(t, eng)
	c := r.caches[0]
	if err := c.WaitL1Layer(context.Background(), h, -1); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("layer -1 before the load's Step: %v, want ErrBadArgument (the layer is checked first)", err)
	}
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	tk := eng.load(t)
	for _, layer := range []int{-1, 4, 99} {
		err := c.WaitL1Layer(context.Background(), h, layer)
		if !errors.Is(err, ErrBadArgument) {
			t.Fatalf("layer %d of a 4-layer load: %v, want ErrBadArgument", layer, err)
		}
		t.Log(err)
	}
	if err := c.WaitL1Layer(context.Background(), Handle(0xdead), 0); !errors.Is(err, ErrStaleHandle) {
		t.Fatalf("a handle that names no node: %v, want ErrStaleHandle", err)
	}
	boom := errors.New("copy failed")
	tk.FinishLayer(0)
	tk.Finish(boom)
	for layer := range 4 {
		if err := c.WaitL1Layer(context.Background(), h, layer); !errors.Is(err, boom) {
			t.Fatalf("layer %d of a failed load: %v, want its error", layer, err)
		}
	}
}

// TestWaitL1LayerOfWholeLoads: with an engine that copies a load whole (one-layer tickets),
// every layer's wait is the whole load's.
func TestWaitL1LayerOfWholeLoads(t *testing.T) {
	eng := &layerEngine{layers: 1}
	r, h := hostHit(t, eng)
	c := r.caches[0]
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	tk := eng.load(t)
	if err := waitBriefly(c, h, 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("layer 5 of an unfinished whole load: %v, want the context's deadline", err)
	}
	tk.Finish(nil)
	if err := c.WaitL1Layer(context.Background(), h, 5); err != nil {
		t.Fatalf("layer 5 of a finished whole load: %v", err)
	}
}

// TestWaitL1LayerOnStream: WaitL1LayerOn hands each load on the prefix to the engine's
// StreamWaiter with the layer and stream, at once (the layer has not landed); an engine
// without stream waits is refused with ErrUnsupported; a failed load returns its error and
// enqueues nothing.
func TestWaitL1LayerOnStream(t *testing.T) {
	eng := &streamEngine{layerEngine: layerEngine{layers: 4}}
	r, h := hostHit(t, eng)
	c := r.caches[0]
	if err := c.WaitL1LayerOn(h, 0, 0x5eed); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("before the load's Step: %v, want ErrNotStarted", err)
	}
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	tk := eng.load(t)
	if err := c.WaitL1LayerOn(h, 2, 0x5eed); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitL1LayerOn(h, 4, 0x5eed); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("layer 4 of a 4-layer load: %v, want ErrBadArgument", err)
	}
	eng.mu.Lock()
	waits := eng.waits
	eng.mu.Unlock()
	if len(waits) != 1 || waits[0] != (streamWait{tk, 2, 0x5eed}) {
		t.Fatalf("stream waits %+v, want one for layer 2 of the load on stream 0x5eed", waits)
	}
	boom := errors.New("copy failed")
	tk.Finish(boom)
	if err := c.WaitL1LayerOn(h, 1, 0x5eed); !errors.Is(err, boom) {
		t.Fatalf("a failed load: %v, want its error", err)
	}
	eng.mu.Lock()
	waits = eng.waits
	eng.mu.Unlock()
	if len(waits) != 1 {
		t.Fatalf("a stream wait was enqueued for a failed load: %+v", waits)
	}

	plain, h2 := hostHit(t, &layerEngine{layers: 4})
	if err := plain.caches[0].WaitL1LayerOn(h2, 0, 0); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("an engine without stream waits: %v, want ErrUnsupported", err)
	} else {
		t.Log(err)
	}
}

// TestWaitL1LayerOnTheLayeredHostEngine: two CP ranks whose host engines copy into per-layer
// L1 buffers (Config.L1): their load tickets report the layout's 4 layers, so every layer's
// wait returns, a fifth layer is refused, a stream wait is unsupported (host memory), and the
// loaded pages hold every chunk where it belongs.
func TestWaitL1LayerOnTheLayeredHostEngine(t *testing.T) {
	kv, err := kvlayout.Parse("layers=4;k=64:sharded;v=64:sharded")
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, rigConfig{
		layout: parallel.LayoutConfig{World: 2, AttnCP: 2}, opts: Options{PageSize: 4, L1Pages: 16},
		pagesPerSlab: 16, pageBytes: 4 * 2 * 4 * 64, kvLayout: &kv, kvL1: true, l2Layout: kvmem.LayerFirst,
	})
	tokens := tokensN(300, 32)
	requireWholeInsert(t, r, tokens)
	evictL1All(t, r)
	ms := make([]MatchResult, 2)
	if err := r.each("load-back", func(i int, c *Cache) error {
		m, err := c.Match(Request{Tokens: tokens})
		if err != nil || m.HostPages != 8 {
			return fmt.Errorf("match: %+v, %v; want 8 host pages", m, err)
		}
		ms[i] = m
		_, err = c.LoadBack(m.Last)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.step(); err != nil { // starts the loads
		t.Fatal(err)
	}
	for i, c := range r.caches {
		for layer := range 4 {
			if err := c.WaitL1Layer(context.Background(), ms[i].Last, layer); err != nil {
				t.Fatalf("rank %d layer %d: %v", i, layer, err)
			}
		}
		// The load is not agreed over before the next step: its ticket still answers.
		if err := c.WaitL1Layer(context.Background(), ms[i].Last, 4); !errors.Is(err, ErrBadArgument) {
			t.Fatalf("rank %d layer 4 of a 4-layer layout: %v, want ErrBadArgument", i, err)
		}
		if err := c.WaitL1LayerOn(ms[i].Last, 0, 0); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("rank %d: a stream wait on host memory: %v, want ErrUnsupported", i, err)
		}
	}
	for r.caches[0].LoadPending(ms[0].Last) {
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := r.matchLoad(tokens, false)
	if err != nil {
		t.Fatal(err)
	}
	if m[0].DevicePages != 8 {
		t.Fatalf("after the loads: %d pages in L1, want 8", m[0].DevicePages)
	}
}
