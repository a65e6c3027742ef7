package cudaengine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
	"github.com/cpcache/cpcache/slab"
)

// The KV tests' model: 3 layers of K and V (32 bytes per token, sharded over attention-TP 2:
// 16 on this rank) and a replicated side buffer of 8 bytes per token, 4-token pages, an L1 of
// 6 slots and an L2 of 2 slabs of 4 pages.
const (
	kvLayers, kvAttnTP, kvPageTokens = 3, 2, 4
	kvSlots, kvSlabs, kvSlabPages    = 6, 2, 4
)

var kvTestLayout = kvlayout.Layout{NumLayers: kvLayers, Parts: []kvlayout.Part{
	{Name: "k", BytesPerToken: 32, Sharding: kvlayout.Sharded},
	{Name: "v", BytesPerToken: 32, Sharding: kvlayout.Sharded},
	{Name: "indexer", BytesPerToken: 8, Sharding: kvlayout.Replicated},
}}

// kvTokenBytes are the parts' bytes per token on this rank (newKVRig checks them against
// kvlayout).
var kvTokenBytes = []int{16, 16, 8}

// l2Layouts are the L2 layouts, by NewKV's LayerFirst.
var l2Layouts = []bool{false, true}

func l2Name(layerFirst bool) string {
	if layerFirst {
		return "layer_first"
	}
	return "page_first"
}

// l1Kinds are the L1 memories the KV tests copy from and to: SGLang's token-slot buffers
// (packed, and with each token padded, which takes a copy per token), and vLLM's block-major
// tensor per layer holding K and V of a block side by side (the side buffer token-slot).
var l1Kinds = []string{"token-slot", "token-slot-padded", "block-major"}

// kvRig is one test setup: device L1 buffers of one kind described as a kvmem.L1 (which
// validates them, overlap included), and pinned host L2 slabs reached through their device
// pointer.
type kvRig struct {
	dev       *cuda.Device
	mem       *cuda.DeviceBuffer // every L1 buffer lies in it
	bufs      []Buffer           // by layer × parts + part
	l1        *kvmem.L1
	shape     *kvmem.Shape
	l2        *cuda.HostBuffer
	pageBytes int
}

func newKVRig(t *testing.T, dev *cuda.Device, kind string) *kvRig {
	t.Helper()
	for j, tb := range kvTokenBytes {
		if got, err := kvTestLayout.PartBytesPerToken(j, kvAttnTP); err != nil || got != tb {
			t.Fatalf("part %d: %d bytes per token on a rank (%v), the test assumes %d", j, got, err, tb)
		}
	}
	pb, err := kvTestLayout.PageBytes(kvPageTokens, kvAttnTP)
	if err != nil {
		t.Fatal(err)
	}
	r := &kvRig{dev: dev, pageBytes: int(pb)}
	// Lay the buffers out in one allocation, each at its offset, with a gap between them.
	type region struct{ off, pageStride, tokenStride, bytes int64 }
	var regions []region
	var end int64
	place := func(bytes int64) int64 { off := end; end += bytes + 256; return off }
	for range kvLayers { // region i is (layer i / parts, part i % parts)
		switch kind {
		case "token-slot", "token-slot-padded":
			for j, tb := range kvTokenBytes {
				ts := int64(tb)
				if kind == "token-slot-padded" {
					ts += int64(8 * (j + 1))
				}
				ps := kvPageTokens * ts
				regions = append(regions, region{place(kvSlots * ps), ps, ts, kvSlots * ps})
			}
		case "block-major": // [blocks, 2, P, 16 bytes]: K of block b, then its V
			ps := int64(2 * kvPageTokens * kvTokenBytes[0])
			off := place(kvSlots * ps)
			kv := int64((kvSlots-1))*ps + int64(kvPageTokens*kvTokenBytes[0])
			regions = append(regions, region{off, ps, int64(kvTokenBytes[0]), kv},
				region{off + int64(kvPageTokens*kvTokenBytes[0]), ps, int64(kvTokenBytes[1]), kv})
			ts := int64(kvTokenBytes[2])
			regions = append(regions, region{place(kvSlots * kvPageTokens * ts), kvPageTokens * ts, ts, kvSlots * kvPageTokens * ts})
		default:
			t.Fatalf("unknown L1 kind %q", kind)
		}
	}
	if r.mem, err = dev.Alloc(int(end)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.mem.Close() })
	for _, g := range regions {
		r.bufs = append(r.bufs, Buffer{Device: r.mem.Ptr().Add(int(g.off)), Bytes: g.bytes, PageStride: g.pageStride, TokenStride: g.tokenStride})
	}
	if r.shape, err = kvmem.NewShape(kvTestLayout, kvAttnTP, kvPageTokens); err != nil {
		t.Fatal(err)
	}
	var kb []kvmem.Buffer
	for i, b := range r.bufs {
		kb = append(kb, kvmem.Buffer{Layer: i / len(kvTokenBytes), Part: i % len(kvTokenBytes), Device: uintptr(b.Device), Bytes: b.Bytes, PageStride: b.PageStride, TokenStride: b.TokenStride})
	}
	if r.l1, err = kvmem.NewL1(r.shape, kvSlots, kb); err != nil {
		t.Fatalf("%s L1: %v", kind, err)
	}
	if r.l2, err = dev.AllocHost(kvSlabs * kvSlabPages * r.pageBytes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.l2.Close() })
	clear(r.l2.Bytes()) // pinned memory comes uninitialized
	return r
}

// addr resolves L2 page {slab, index} to slab × N + index pages into the pinned L2.
func (r *kvRig) addr(p slab.Page) (cuda.DevicePtr, error) {
	if p.Slab < 0 || p.Slab >= kvSlabs || p.Index < 0 || p.Index >= kvSlabPages {
		return 0, fmt.Errorf("%w: L2 page %v outside %d slabs of %d pages", slab.ErrBadArgument, p, kvSlabs, kvSlabPages)
	}
	return r.l2.DevicePtr().Add((p.Slab*kvSlabPages + p.Index) * r.pageBytes), nil
}

// kv describes the rig's memory for NewKV.
func (r *kvRig) kv(layerFirst bool) KV {
	return KV{Layers: kvLayers, PageTokens: kvPageTokens, Slots: kvSlots, TokenBytes: kvTokenBytes, Buffers: r.bufs,
		LayerFirst: layerFirst, PagesPerSlab: kvSlabPages, L2: r.addr}
}

// engine is a KV engine over the rig's kvmem.L1 (through KVOf).
func (r *kvRig) engine(t *testing.T, layerFirst bool, opts Options) *Engine {
	t.Helper()
	lay := kvmem.PageFirst
	if layerFirst {
		lay = kvmem.LayerFirst
	}
	kv, err := KVOf(r.l1, lay, kvSlabPages, r.addr)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewKV(r.dev, kv, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close engine: %v", err)
		}
	})
	return e
}

// kvByte is the test content of byte b of token k of part j of layer l of the page computed
// into L1 slot s: every (slot, layer, part, token) chunk differs, so a chunk that lands in
// another layer's, part's or token's place is seen.
func kvByte(s, l, j, k, b int) byte { return byte(s*131 + l*37 + j*17 + k*7 + b*3 + 1) }

// l1Offset is the offset in r.mem of byte b of token k of (layer l, part j) at slot s, from
// the buffer's description.
func (r *kvRig) l1Offset(s, l, j, k, b int) int {
	bf := r.bufs[l*len(kvTokenBytes)+j]
	return int(bf.Device-r.mem.Ptr()) + s*int(bf.PageStride) + k*int(bf.TokenStride) + b
}

// l2Offset is the offset in the L2 of byte b of token k of (layer l, part j) of page p, from
// the layouts' definitions (not from the engine): page_first, the page's layers in order and
// each layer's parts in layout order; layer_first, per layer that layer of all N pages of the
// slab.
func l2Offset(layerFirst bool, p slab.Page, l, j, k, b int) int {
	chunk := func(j int) int { return kvPageTokens * kvTokenBytes[j] }
	layerBytes, partOff := 0, 0
	for i := range kvTokenBytes {
		layerBytes += chunk(i)
		if i < j {
			partOff += chunk(i)
		}
	}
	pageBytes := kvLayers * layerBytes
	in := partOff + k*kvTokenBytes[j] + b
	if !layerFirst {
		return (p.Slab*kvSlabPages+p.Index)*pageBytes + l*layerBytes + in
	}
	return p.Slab*kvSlabPages*pageBytes + l*kvSlabPages*layerBytes + p.Index*layerBytes + in
}

// fillL1 writes every slot's content (kvByte) into the L1 buffers and zero elsewhere
// (padding, gaps); it returns the image it wrote.
func (r *kvRig) fillL1(t *testing.T) []byte {
	t.Helper()
	img := make([]byte, r.mem.Size())
	r.eachByte(func(s, l, j, k, b int) { img[r.l1Offset(s, l, j, k, b)] = kvByte(s, l, j, k, b) })
	if err := r.mem.Write(0, img); err != nil {
		t.Fatal(err)
	}
	if err := r.dev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return img
}

func (r *kvRig) eachByte(f func(s, l, j, k, b int)) {
	for s := range kvSlots {
		for l := range kvLayers {
			for j, tb := range kvTokenBytes {
				for k := range kvPageTokens {
					for b := range tb {
						f(s, l, j, k, b)
					}
				}
			}
		}
	}
}

// kvStep is two transfers of kind k: slots 2, 0 to L2 pages {0,3}, {1,0}, and slot 5 to {0,1}
// (backups; loads the other way round, into the slots given).
func kvStep(k core.Kind, slots [3]int32) []core.Transfer {
	return []core.Transfer{
		{Kind: k, Node: 1, Copies: []core.Copy{{L1: slots[0], L2: slab.Page{Slab: 0, Index: 3}}, {L1: slots[1], L2: slab.Page{Slab: 1, Index: 0}}}},
		{Kind: k, Node: 2, Copies: []core.Copy{{L1: slots[2], L2: slab.Page{Slab: 0, Index: 1}}}},
	}
}

// backedUp are the L1 slots whose content kvStep(core.Write, backedUp) puts in L2.
var backedUp = [3]int32{2, 0, 5}

// checkL2 compares the L2 with the pages of backedUp placed by lay; every other byte is zero.
func (r *kvRig) checkL2(t *testing.T, lay bool) {
	t.Helper()
	want := make([]byte, r.l2.Size())
	for _, tr := range kvStep(core.Write, backedUp) {
		for _, c := range tr.Copies {
			eachChunkByte(func(l, j, k, b int) { want[l2Offset(lay, c.L2, l, j, k, b)] = kvByte(int(c.L1), l, j, k, b) })
		}
	}
	if i, what := firstDiff(r.l2.Bytes(), want); i >= 0 {
		t.Fatalf("L2 (%s) byte %d: %s", l2Name(lay), i, what)
	}
	// The test's reading of the layouts is kvmem's (the host engine's) too.
	kl := kvmem.PageFirst
	if lay {
		kl = kvmem.LayerFirst
	}
	for l := range kvLayers {
		for j := range kvTokenBytes {
			p := slab.Page{Index: kvSlabPages - 1}
			off, err := r.shape.L2ChunkOffset(kl, kvSlabPages, p.Index, l, j)
			if err != nil || off != int64(l2Offset(lay, p, l, j, 0, 0)) {
				t.Fatalf("kvmem places chunk (page %d, layer %d, part %d) at %d (%v), this test at %d", p.Index, l, j, off, err, l2Offset(lay, p, l, j, 0, 0))
			}
		}
	}
}

// eachChunkByte calls f for every byte of one page: layer l, part j, token k, byte b.
func eachChunkByte(f func(l, j, k, b int)) {
	for l := range kvLayers {
		for j, tb := range kvTokenBytes {
			for k := range kvPageTokens {
				for b := range tb {
					f(l, j, k, b)
				}
			}
		}
	}
}

// loadedImage is the L1 image after the pages of backedUp were loaded into slots (and the
// L1 was zero before), for layers below upTo only.
func (r *kvRig) loadedImage(slots [3]int32, upTo int) []byte {
	img := make([]byte, r.mem.Size())
	for i, s := range slots {
		from := int(backedUp[i])
		eachChunkByte(func(l, j, k, b int) {
			if l < upTo {
				img[r.l1Offset(int(s), l, j, k, b)] = kvByte(from, l, j, k, b)
			}
		})
	}
	return img
}

// readL1 reads the whole L1 allocation (on the fake driver a synchronous read sees only the
// work that has run).
func (r *kvRig) readL1(t *testing.T) []byte {
	t.Helper()
	got := make([]byte, r.mem.Size())
	if err := r.mem.Read(0, got); err != nil {
		t.Fatal(err)
	}
	return got
}

func firstDiff(got, want []byte) (int, string) {
	for i := range got {
		if got[i] != want[i] {
			return i, fmt.Sprintf("got 0x%02x, want 0x%02x", got[i], want[i])
		}
	}
	return -1, ""
}

func clearL1(t *testing.T, r *kvRig) {
	t.Helper()
	if err := r.mem.Fill(0); err != nil {
		t.Fatal(err)
	}
	if err := r.dev.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// TestGPUKVChunkPlacement: for every L1 kind and both L2 layouts, a step of backups puts
// chunk (page, layer, part) of each L1 slot exactly where the L2 layout says, and a step of
// loads puts each back exactly where the L1 buffers say (other slots, padding and gaps stay
// zero); the driver's batch call is used (the fake driver refuses a batch whose copies
// overlap), and a vLLM block's K and V go as one copy per layer.
func TestGPUKVChunkPlacement(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	fake := os.Getenv(fakelib.Env) != ""
	for _, kind := range l1Kinds {
		for _, lay := range l2Layouts {
			t.Run(kind+"/"+l2Name(lay), func(t *testing.T) {
				r := newKVRig(t, dev, kind)
				e := r.engine(t, lay, Options{})
				r.fillL1(t)
				for _, tk := range e.SubmitStep(kvStep(core.Write, backedUp)) {
					if err := tk.Err(); err != nil {
						t.Fatal(err)
					}
					if tk.Layers() != 1 {
						t.Errorf("a backup reports %d layers, want 1 (backups complete whole)", tk.Layers())
					}
				}
				if fake && !e.Batched() {
					t.Errorf("the backup did not use the driver's batch call (the fake refuses overlapping copies)")
				}
				r.checkL2(t, lay)

				clearL1(t, r)
				into := [3]int32{4, 1, 3}
				calls, copies := e.CopyCalls(), e.Copies()
				for _, tk := range e.SubmitStep(kvStep(core.Load, into)) {
					if err := tk.Err(); err != nil {
						t.Fatal(err)
					}
					if tk.Layers() != kvLayers {
						t.Errorf("a load reports %d layers, want %d", tk.Layers(), kvLayers)
					}
				}
				if i, what := firstDiff(r.readL1(t), r.loadedImage(into, kvLayers)); i >= 0 {
					t.Fatalf("L1 byte %d after the load: %s", i, what)
				}
				if got := e.CopyCalls() - calls; got != kvLayers {
					t.Errorf("the load step took %d copy calls, want one per layer (%d)", got, kvLayers)
				}
				// Chunk copies per page and layer: packed token-slot buffers 3 (one per part),
				// padded ones 3 × 4 tokens, block-major 2 (a block's K and V are adjacent in L1
				// and in either L2 layout: one copy; then the side buffer).
				per := map[string]int64{"token-slot": 3, "token-slot-padded": 3 * kvPageTokens, "block-major": 2}[kind]
				if got, want := e.Copies()-copies, 3*kvLayers*per; got != want {
					t.Errorf("the load step of 3 pages enqueued %d copies, want %d", got, want)
				}
			})
		}
	}
}

// TestGPUKVLayeredLoad: a step's loads are enqueued layer 0 of every page of every transfer
// first, with an event after each layer; the tickets finish layer by layer, in order, and
// only once that layer's event completed; WaitLayerOn makes a compute stream wait for one
// layer without blocking the host. The engine's waiter is held before each event, so the
// test sees the step between layers. On the fake driver, whose streams run only when waited
// for, it also checks that a layer's event captured exactly that layer of both transfers.
func TestGPUKVLayeredLoad(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	fake := os.Getenv(fakelib.Env) != ""
	for _, kind := range l1Kinds {
		for _, lay := range l2Layouts {
			t.Run(kind+"/"+l2Name(lay), func(t *testing.T) {
				r := newKVRig(t, dev, kind)
				r.fillL1(t)
				for _, tk := range r.engine(t, lay, Options{}).SubmitStep(kvStep(core.Write, backedUp)) {
					if err := tk.Err(); err != nil {
						t.Fatal(err)
					}
				}
				clearL1(t, r)
				compute, err := dev.NewStream()
				if err != nil {
					t.Fatal(err)
				}
				defer compute.Close()
				scratch, err := dev.Alloc(r.mem.Size())
				if err != nil {
					t.Fatal(err)
				}
				defer scratch.Close()

				e := r.engine(t, lay, Options{})
				gate := holdWaiters(e)
				released := false
				defer func() {
					if !released {
						close(gate)
					}
				}()
				into := [3]int32{4, 1, 3}
				tks := e.SubmitStep(kvStep(core.Load, into))
				// The compute stream waits for layer 0 of the first transfer, then copies the
				// whole L1 to scratch: what it sees is what had landed when layer 0's event
				// completed.
				if err := e.WaitLayerOn(tks[0], 0, compute.Handle()); err != nil {
					t.Fatal(err)
				}
				if fake {
					if i, what := firstDiff(r.readL1(t), make([]byte, r.mem.Size())); i >= 0 {
						t.Fatalf("WaitLayerOn ran copies on the calling thread: L1 byte %d %s", i, what)
					}
				}
				if err := compute.CopyDtoD(scratch.Ptr(), r.mem.Ptr(), r.mem.Size()); err != nil {
					t.Fatal(err)
				}
				if err := compute.Synchronize(); err != nil {
					t.Fatal(err)
				}
				seen := make([]byte, r.mem.Size())
				if err := scratch.Read(0, seen); err != nil {
					t.Fatal(err)
				}
				layer0 := r.loadedImage(into, 1)
				for i := range seen {
					if layer0[i] != 0 && seen[i] != layer0[i] {
						t.Fatalf("the compute stream ran before layer 0 landed: L1 byte %d is 0x%02x, want 0x%02x", i, seen[i], layer0[i])
					}
				}
				if fake {
					if i, what := firstDiff(seen, layer0); i >= 0 {
						t.Fatalf("layer 0's event captured more than layer 0 of both transfers: L1 byte %d %s", i, what)
					}
				}
				for l := range kvLayers {
					for i, tk := range tks {
						select {
						case <-tk.LayerDone(l):
							t.Fatalf("transfer %d: layer %d finished before its event was waited for", i, l)
						default:
						}
					}
					gate <- struct{}{} // the waiter waits for layer l's event
					for i, tk := range tks {
						if err := tk.LayerErr(l); err != nil {
							t.Fatalf("transfer %d layer %d: %v", i, l, err)
						}
					}
					got := r.readL1(t)
					want := r.loadedImage(into, l+1)
					for i := range got {
						if want[i] != 0 && got[i] != want[i] {
							t.Fatalf("layer %d finished but L1 byte %d is 0x%02x, want 0x%02x", l, i, got[i], want[i])
						}
					}
					if fake {
						if i, what := firstDiff(got, want); i >= 0 {
							t.Fatalf("after layer %d's event, L1 byte %d: %s (a later layer ran before its event)", l, i, what)
						}
					}
				}
				close(gate)
				released = true
				for i, tk := range tks {
					if err := tk.Err(); err != nil {
						t.Fatalf("transfer %d: %v", i, err)
					}
				}
				if i, what := firstDiff(r.readL1(t), r.loadedImage(into, kvLayers)); i >= 0 {
					t.Fatalf("L1 byte %d after the load: %s", i, what)
				}
				if err := e.WaitLayerOn(tks[1], kvLayers+5, compute.Handle()); err != nil {
					t.Errorf("WaitLayerOn past the last layer of a finished load: %v", err)
				}
				if err := e.WaitLayerOn(engine.NewTicket(kvStep(core.Load, into)[0]), 0, compute.Handle()); !errors.Is(err, core.ErrBadArgument) {
					t.Errorf("WaitLayerOn for another engine's ticket: %v, want ErrBadArgument", err)
				}
			})
		}
	}
}

// TestGPUKVRejectsBadInput: a slot outside the L1 and a layer_first page outside its slab fail
// their transfer alone with ErrBadArgument; bad descriptions are refused at NewKV with
// ErrBadConfig naming the layer and part.
func TestGPUKVRejectsBadInput(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	r := newKVRig(t, dev, "token-slot")
	e := r.engine(t, true, Options{})
	bad := []core.Transfer{
		{Kind: core.Load, Node: 7, Copies: []core.Copy{{L1: kvSlots, L2: slab.Page{}}}},
		{Kind: core.Write, Node: 8, Copies: []core.Copy{{L1: 0, L2: slab.Page{Index: kvSlabPages}}}},
		{Kind: core.Load, Node: 9, Copies: []core.Copy{{L1: -1, L2: slab.Page{}}}},
	}
	for i, tk := range e.SubmitStep(bad) {
		if err := tk.Err(); !errors.Is(err, core.ErrBadArgument) {
			t.Errorf("bad transfer %d: %v, want ErrBadArgument", i, err)
		}
	}
	hostShape, err := kvmem.NewShape(kvTestLayout, kvAttnTP, kvPageTokens)
	if err != nil {
		t.Fatal(err)
	}
	host, err := kvmem.NewL1(hostShape, kvSlots, kvmem.AllocTokenSlotBuffers(hostShape, kvSlots))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := KVOf(host, kvmem.PageFirst, kvSlabPages, r.addr); !errors.Is(err, core.ErrBadConfig) {
		t.Errorf("KVOf a host L1: %v, want ErrBadConfig", err)
	}
	if _, err := KVOf(r.l1, kvmem.L2Layout(9), kvSlabPages, r.addr); !errors.Is(err, core.ErrBadConfig) {
		t.Errorf("KVOf with L2 layout 9: %v, want ErrBadConfig", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*KV)
		want string
	}{
		{"layer_first without pages per slab", func(kv *KV) { kv.PagesPerSlab = 0 }, "pages per slab"},
		{"no parts", func(kv *KV) { kv.TokenBytes = nil }, "3 layers of 0 parts"},
		{"a buffer missing", func(kv *KV) { kv.Buffers = kv.Buffers[1:] }, "8 buffers for 3 layers × 3 parts"},
		{"too small", func(kv *KV) { kv.Buffers[4].Bytes-- }, "layer 1 part 1: buffer of"},
		{"token stride below the part's bytes", func(kv *KV) { kv.Buffers[5].TokenStride = 4 }, "layer 1 part 2:"},
		{"no address", func(kv *KV) { kv.Buffers[8].Device = 0 }, "layer 2 part 2:"},
		{"zero slots", func(kv *KV) { kv.Slots = 0 }, "0 slots"},
	} {
		kv := r.kv(true)
		kv.Buffers = append([]Buffer(nil), kv.Buffers...)
		tc.edit(&kv)
		if _, err := NewKV(dev, kv, Options{}); !errors.Is(err, core.ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrBadConfig saying %q", tc.name, err, tc.want)
		}
	}
}

// TestGPUKVFailedLayerFailsTheLoad: when a copy of layer 1 of a layered load fails to
// enqueue, every ticket of the group fails (for every layer: a failed load serves none), and
// only once the copies enqueued before it (layer 0) have run, since the core frees or reuses
// the slots of a failed load. Needs the fake driver's failure injection with its batch call
// off (the copies then go one by one): CPCACHE_FAKE_CUDA_COPY_FAIL_AT=11 is the second copy of
// layer 1 (9 chunk copies per layer: 3 pages × 3 parts).
func TestGPUKVFailedLayerFailsTheLoad(t *testing.T) {
	if os.Getenv(envFakeCopyFailAt) != "11" {
		t.Skipf("needs the fake driver's failure injection (%s=11): a real driver's copies do not fail on demand", envFakeCopyFailAt)
	}
	_, dev := cudatest.RequireGPU(t)
	r := newKVRig(t, dev, "token-slot")
	// Put the pages of backedUp into L2 directly (no backup: the failure counts copies).
	for _, tr := range kvStep(core.Write, backedUp) {
		for _, c := range tr.Copies {
			eachChunkByte(func(l, j, k, b int) {
				r.l2.Bytes()[l2Offset(false, c.L2, l, j, k, b)] = kvByte(int(c.L1), l, j, k, b)
			})
		}
	}
	clearL1(t, r)
	e := r.engine(t, false, Options{})
	into := [3]int32{4, 1, 3}
	tks := e.SubmitStep(kvStep(core.Load, into))
	for i, tk := range tks {
		err := tk.Err()
		if err == nil || !strings.Contains(err.Error(), "layer 1") {
			t.Errorf("transfer %d: %v, want the failure of layer 1", i, err)
		}
		if lerr := tk.LayerErr(0); lerr == nil {
			t.Errorf("transfer %d: layer 0 of a failed load reports no error", i)
		}
	}
	got := r.readL1(t)
	want := r.loadedImage(into, 1)
	for i := range got {
		if want[i] != 0 && got[i] != want[i] {
			t.Fatalf("the tickets failed before layer 0's enqueued copies ran: L1 byte %d is 0x%02x, want 0x%02x", i, got[i], want[i])
		}
	}
}
