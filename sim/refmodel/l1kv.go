package refmodel

import (
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvmem"
)

// L1KV is a request's KV on one rank of an engine that lends the model's per-layer buffers
// to the cache: the cached prefix (whole pages) is read from the cache's L1 at the slots a
// Match gave, every later position lives in Scratch until the request is inserted and its
// pages are stored into the slots the insert gave (StorePage).
type L1KV struct {
	L1      *kvmem.L1
	Slots   []int32 // L1 slot of each cached prefix page, in page order (this rank reads only its own)
	Scratch *MemKV  // positions after the prefix
}

// TokenKV implements KV: a prefix position's bytes in its page's L1 slot (at the buffer's
// token stride), any other position's in Scratch.
func (k *L1KV) TokenKV(layer, part, pos int) ([]byte, error) {
	P := k.L1.Shape().PageTokens()
	if pg := pos / P; pos >= 0 && pg < len(k.Slots) {
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
// slot `slot`: what an engine does for the pages an insert asks it to fill. The page must
// follow the prefix.
func (k *L1KV) StorePage(slot int32, page int) error {
	if page < len(k.Slots) {
		return fmt.Errorf("refmodel: page %d is in the cached prefix of %d pages, not in the scratch", page, len(k.Slots))
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
