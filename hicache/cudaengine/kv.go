package cudaengine

import (
	"fmt"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/slab"
)

// kvPlan is what turns a transfer's pages into chunk copies: the geometry of the engine's
// L1 buffers and of the L2 layout, taken from a kvmem.L1 at NewKV. A chunk is P tokens of
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
		a, err := l2(c.L2)
		if err != nil {
			return nil, fmt.Errorf("hicache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		if k.layerFirst {
			if c.L2.Index < 0 || c.L2.Index >= k.pagesPerSlab {
				return nil, fmt.Errorf("hicache: %s of node %d: %w: L2 page %v outside a layer_first slab of %d pages", t.Kind, t.Node, core.ErrBadArgument, c.L2, k.pagesPerSlab)
			}
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
