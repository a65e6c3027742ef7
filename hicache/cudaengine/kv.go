package cudaengine

import (
	"fmt"
	"math"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/slab"
)

// kvPlan is what turns a transfer's pages into chunk copies: the geometry of the engine's
// L1 buffers and of the L2 layout, checked and taken from a KV at NewKV. A chunk is P tokens of
// one part of one layer of one page.
type kvPlan struct {
	layers, parts int
	pageTokens    int
	slots         int
	tokenBytes    []int   // by part: bytes per token on this rank
	partOffset    []int64 // by part: offset of its chunk within a page's bytes of one layer
	layerBytes    int64   // bytes of one layer of one page (all parts)
	bufs          []kvBuf // by layer × parts + part
	layerFirst    bool    // L2 layer_first (else page_first)
	pagesPerSlab  int     // N: pages per L2 slab, for layer_first
}

// kvBuf is one (layer, part) buffer of the L1, in device addresses.
type kvBuf struct {
	base                    cuda.DevicePtr
	pageStride, tokenStride int64
}

// copies returns t's chunk copies by layer: layer l holds, page by page in t's order, the
// chunks of every part of layer l, one copy per chunk when the L1 buffer's tokens are packed
// (TokenStride == bytes per token) and one per token otherwise. Copies that continue the
// previous one on both sides (the parts of a vLLM block, consecutive slots and pages) are
// merged into it.
func (k *kvPlan) copies(t core.Transfer, l2 L2Addr) ([][]cuda.Copy1, error) {
	// Resolve every page's L2 chunk base once: page_first, the page's address; layer_first,
	// its slab's base plus the page's offset within one layer's block.
	l2base := make([]cuda.DevicePtr, len(t.Copies))
	var slabBase map[int]cuda.DevicePtr
	for i, c := range t.Copies {
		if c.L1 < 0 || int(c.L1) >= k.slots {
			return nil, fmt.Errorf("hicache: %s of node %d: %w: L1 slot %d outside an L1 of %d slots", t.Kind, t.Node, core.ErrBadArgument, c.L1, k.slots)
		}
		if k.layerFirst && (c.L2.Index < 0 || c.L2.Index >= k.pagesPerSlab) {
			return nil, fmt.Errorf("hicache: %s of node %d: %w: L2 page %v outside a layer_first slab of %d pages", t.Kind, t.Node, core.ErrBadArgument, c.L2, k.pagesPerSlab)
		}
		a, err := l2(c.L2) // resolved in both layouts: the resolver checks the page exists
		if err != nil {
			return nil, fmt.Errorf("hicache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		if k.layerFirst {
			base, ok := slabBase[c.L2.Slab]
			if !ok {
				if base, err = l2(slab.Page{Slab: c.L2.Slab}); err != nil {
					return nil, fmt.Errorf("hicache: %s of node %d: slab %d's base: %w", t.Kind, t.Node, c.L2.Slab, err)
				}
				if slabBase == nil {
					slabBase = make(map[int]cuda.DevicePtr)
				}
				slabBase[c.L2.Slab] = base
			}
			a = base + cuda.DevicePtr(int64(c.L2.Index)*k.layerBytes)
		}
		l2base[i] = a
	}
	load := t.Kind == core.Load
	out := make([][]cuda.Copy1, k.layers)
	for l := range k.layers {
		// L2 offset of layer l's bytes of a page: page_first, l layers into the page;
		// layer_first, l blocks of N pages into the slab.
		var layerOff int64
		if k.layerFirst {
			layerOff = int64(l) * int64(k.pagesPerSlab) * k.layerBytes
		} else {
			layerOff = int64(l) * k.layerBytes
		}
		var cp []cuda.Copy1
		for i, c := range t.Copies {
			for j := range k.parts {
				b := k.bufs[l*k.parts+j]
				l1 := b.base + cuda.DevicePtr(int64(c.L1)*b.pageStride)
				l2 := l2base[i] + cuda.DevicePtr(layerOff+k.partOffset[j])
				tb := k.tokenBytes[j]
				if b.tokenStride == int64(tb) {
					cp = appendCopy(cp, load, l1, l2, tb*k.pageTokens)
					continue
				}
				for tok := range k.pageTokens {
					cp = appendCopy(cp, load, l1+cuda.DevicePtr(int64(tok)*b.tokenStride), l2+cuda.DevicePtr(tok*tb), tb)
				}
			}
		}
		out[l] = cp
	}
	return out, nil
}

// appendCopy appends the copy of n bytes between l1 and l2 (to l1 for a load, to l2 for a
// backup), extending the last copy instead when it ends where this one starts on both sides.
func appendCopy(cp []cuda.Copy1, load bool, l1, l2 cuda.DevicePtr, n int) []cuda.Copy1 {
	dst, src := l2, l1
	if load {
		dst, src = l1, l2
	}
	if last := len(cp) - 1; last >= 0 && cp[last].Dst.Add(cp[last].Size) == dst && cp[last].Src.Add(cp[last].Size) == src {
		cp[last].Size += n
		return cp
	}
	return append(cp, cuda.Copy1{Dst: dst, Src: src, Size: n})
}

// KV is the memory an engine made by NewKV copies between: the inference engine's L1 (the
// device form of a kvmem.L1: a buffer per (layer, part), lent by the engine) and the L2 pages
// with their layout.
type KV struct {
	Layers     int // model layers
	PageTokens int // tokens per page (P)
	Slots      int // L1 page slots: every buffer holds Slots pages
	// TokenBytes are, by part, the bytes of one token of one layer on this rank
	// (kvlayout.Layout.PartBytesPerToken); a chunk is PageTokens × TokenBytes[part].
	TokenBytes []int
	// Buffers are the L1 buffers by layer × len(TokenBytes) + part.
	Buffers []Buffer
	// LayerFirst selects the L2 layout layer_first (a slab holds, per layer, that layer of all
	// its PagesPerSlab pages: chunk (page p, layer l, part j) at l × N × layerBytes +
	// p × layerBytes + offset of j); else page_first (a page holds layer 0's parts in order,
	// then layer 1's ...: the L3 value).
	LayerFirst   bool
	PagesPerSlab int // N, for LayerFirst
	// L2 resolves L2 pages to device-visible addresses, as for New; with LayerFirst the address
	// of a slab's page 0 is the slab's base.
	L2 L2Addr
}

// Buffer is one (layer, part) L1 buffer in device memory (kvmem.Buffer with Device set).
type Buffer struct {
	Device      cuda.DevicePtr // address of slot 0, token 0
	Bytes       int64          // size from Device
	PageStride  int64          // bytes from slot s to s+1 (token-slot buffers: P × TokenStride; vLLM block-major: the block stride)
	TokenStride int64          // bytes from token k to k+1 of a slot (>= the part's bytes per token)
}

// NewKV returns an engine that copies pages between the device L1 buffers of kv and L2 pages
// in kv's L2 layout, chunk by chunk: a page is, for each layer and part, P tokens at the L1
// buffer's slot (one copy when its tokens are packed, one per token when TokenStride is
// larger) and one contiguous chunk of the L2 page. A step's chunks go to a lane as batched
// copies (cuMemcpyBatchAsync, else one by one); a load's are enqueued layer 0 of every page
// first with an event after each layer, its ticket finishing layer by layer
// (engine.NewLayeredTicket), and WaitLayerOn lets a compute stream wait for one layer. The
// caller keeps ownership of the memory. A bad description is an error wrapping
// core.ErrBadConfig naming the layer and part.
func NewKV(dev *cuda.Device, kv KV, opts Options) (*Engine, error) {
	if dev == nil || kv.L2 == nil {
		return nil, fmt.Errorf("%w: CUDA engine needs a device and an L2 address resolver (device %v, resolver %v)", core.ErrBadConfig, dev != nil, kv.L2 != nil)
	}
	plan, err := planOf(kv)
	if err != nil {
		return nil, err
	}
	e := &Engine{dev: dev, kv: plan, l2: kv.L2}
	return e.start(opts)
}

// planOf checks kv and takes its geometry.
func planOf(kv KV) (*kvPlan, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: CUDA engine KV L1: %s", core.ErrBadConfig, fmt.Sprintf(format, args...))
	}
	parts := len(kv.TokenBytes)
	switch {
	case kv.Layers <= 0 || parts == 0:
		return nil, bad("%d layers of %d parts", kv.Layers, parts)
	case kv.PageTokens <= 0:
		return nil, bad("%d tokens per page", kv.PageTokens)
	case kv.Slots <= 0 || kv.Slots > math.MaxInt32+1: // slots are int32
		return nil, bad("%d slots outside [1, 2^31]", kv.Slots)
	case len(kv.Buffers) != kv.Layers*parts:
		return nil, bad("%d buffers for %d layers × %d parts", len(kv.Buffers), kv.Layers, parts)
	case kv.LayerFirst && kv.PagesPerSlab <= 0:
		return nil, bad("L2 layout layer_first needs the pages per slab, not %d", kv.PagesPerSlab)
	}
	p := &kvPlan{layers: kv.Layers, parts: parts, pageTokens: kv.PageTokens, slots: kv.Slots,
		layerFirst: kv.LayerFirst, pagesPerSlab: kv.PagesPerSlab}
	const limit = math.MaxInt64 / 4 // every size below stays far from overflow
	for j, tb := range kv.TokenBytes {
		if tb <= 0 || int64(tb) > limit/int64(kv.PageTokens)/int64(kv.Layers*parts) {
			return nil, bad("part %d: %d bytes per token", j, tb)
		}
		p.tokenBytes = append(p.tokenBytes, tb)
		p.partOffset = append(p.partOffset, p.layerBytes)
		p.layerBytes += int64(kv.PageTokens * tb)
	}
	if kv.LayerFirst && int64(kv.PagesPerSlab) > limit/(p.layerBytes*int64(kv.Layers)) {
		return nil, bad("a layer_first slab of %d pages of %d bytes overflows", kv.PagesPerSlab, p.layerBytes*int64(kv.Layers))
	}
	for i, b := range kv.Buffers {
		l, j := i/parts, i%parts
		tb := int64(kv.TokenBytes[j])
		if b.Device == 0 || b.TokenStride < tb || b.PageStride <= 0 || b.PageStride > limit/int64(kv.Slots) || b.TokenStride > limit/int64(kv.PageTokens) {
			return nil, bad("layer %d part %d: buffer at %v with page stride %d and token stride %d (bytes per token %d)", l, j, b.Device, b.PageStride, b.TokenStride, tb)
		}
		// The last byte a copy touches: token P-1 of slot Slots-1.
		if need := int64(kv.Slots-1)*b.PageStride + int64(kv.PageTokens-1)*b.TokenStride + tb; b.Bytes < need || uint64(b.Device) > math.MaxUint64-uint64(need) {
			return nil, bad("layer %d part %d: buffer of %d bytes at %v is too small for %d slots (needs %d)", l, j, b.Bytes, b.Device, kv.Slots, need)
		}
		p.bufs = append(p.bufs, kvBuf{base: b.Device, pageStride: b.PageStride, tokenStride: b.TokenStride})
	}
	return p, nil
}

// KVOf describes l1, a kvmem.L1 of device buffers, with L2 pages in layout lay (pagesPerSlab
// pages per slab, for LayerFirst) resolved by l2, for NewKV. A host L1 (that is the host
// engine's), an L2 layout that is neither, or a missing resolver is an error wrapping
// core.ErrBadConfig.
func KVOf(l1 *kvmem.L1, lay kvmem.L2Layout, pagesPerSlab int, l2 L2Addr) (KV, error) {
	switch {
	case l1 == nil || l2 == nil:
		return KV{}, fmt.Errorf("%w: CUDA engine needs an L1 and an L2 address resolver (L1 %v, resolver %v)", core.ErrBadConfig, l1 != nil, l2 != nil)
	case !l1.Device():
		return KV{}, fmt.Errorf("%w: CUDA engine: the L1 is host memory; the CUDA engine copies device buffers (use the host engine)", core.ErrBadConfig)
	case !lay.Valid():
		return KV{}, fmt.Errorf("%w: CUDA engine: L2 layout %s is neither %s nor %s", core.ErrBadConfig, lay, kvmem.PageFirst, kvmem.LayerFirst)
	}
	sh := l1.Shape()
	kv := KV{Layers: sh.Layers(), PageTokens: sh.PageTokens(), Slots: l1.Slots(),
		LayerFirst: lay == kvmem.LayerFirst, PagesPerSlab: pagesPerSlab, L2: l2}
	for j := range sh.Parts() {
		kv.TokenBytes = append(kv.TokenBytes, sh.PartBytesPerToken(j))
	}
	for l := range sh.Layers() {
		for j := range sh.Parts() {
			b := l1.Buffer(l, j)
			kv.Buffers = append(kv.Buffers, Buffer{Device: cuda.DevicePtr(b.Device), Bytes: b.Bytes, PageStride: b.PageStride, TokenStride: b.TokenStride})
		}
	}
	return kv, nil
}
