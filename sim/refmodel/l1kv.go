package refmodel

import (
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvmem"
)

// L1KV is a request's KV on one rank of an engine that lends the model's per-layer buffers
// to the cache. A page with an L1 slot (Slots[page] >= 0) lives in that slot: the cached
// prefix is read where a Match put it and, when the engine owns the slots (hicache's
// EngineOwned mode), the new pages are written straight into the slots its allocator gave
// before they are inserted with them. Every other position lives in Scratch: in the
// cache-owned mode, until the request is inserted and its pages are stored into the slots
// the insert gave (StorePage).
type L1KV struct {
	L1 *kvmem.L1
	// Slots is the L1 slot of each page from page 0 on, in page order; this rank reads and
	// writes only its own pages', and one negative (another rank's page, or one of its own
	// to keep in Scratch) or past the end puts the page in Scratch.
	Slots   []int32
	Scratch *MemKV
}

// TokenKV implements KV: the bytes of a position of a page with a slot in that L1 slot (at
// the buffer's token stride), any other position's in Scratch.
func (k *L1KV) TokenKV(layer, part, pos int) ([]byte, error) {
	P := k.L1.Shape().PageTokens()
	if pg := pos / P; pos >= 0 && pg < len(k.Slots) && k.Slots[pg] >= 0 {
		chunk, err := k.L1.HostChunk(k.Slots[pg], layer, part)
		if err != nil {
			return nil, err
		}
		bpt := k.L1.Shape().PartBytesPerToken(part)
		off := (pos % P) * int(k.L1.Buffer(layer, part).TokenStride)
		return chunk[off : off+bpt : off+bpt], nil
	}
	return k.Scratch.TokenKV(layer, part, pos)
}

// StorePage copies sequence page `page`'s KV (every layer and part) from Scratch into L1
// slot `slot`: what an engine does for the pages an insert asks it to fill. The page must be
// in Scratch (no slot in Slots).
func (k *L1KV) StorePage(slot int32, page int) error {
	if page >= 0 && page < len(k.Slots) && k.Slots[page] >= 0 {
		return fmt.Errorf("refmodel: page %d lives in L1 slot %d, not in the scratch", page, k.Slots[page])
	}
	s := k.L1.Shape()
	P := s.PageTokens()
	for layer := range s.Layers() {
		for part := range s.Parts() {
			dst, err := k.L1.HostChunk(slot, layer, part)
			if err != nil {
				return err
			}
			bpt := s.PartBytesPerToken(part)
			stride := int(k.L1.Buffer(layer, part).TokenStride)
			for t := range P {
				src, err := k.Scratch.TokenKV(layer, part, page*P+t)
				if err != nil {
					return err
				}
				copy(dst[t*stride:t*stride+bpt], src)
			}
		}
	}
	return nil
}
