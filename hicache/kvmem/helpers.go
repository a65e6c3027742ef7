package kvmem

// TokenSlotBuffers describes SGLang-style host buffers: per (layer, part) one buffer
// [slots × P, bytes per token] indexed by token slot (token k of page slot s is token slot
// s×P+k). mem(layer, part) returns that buffer's memory. The buffers go to NewL1 as they are.
func TokenSlotBuffers(s *Shape, mem func(layer, part int) []byte) []Buffer {
	var out []Buffer
	for l := range s.Layers() {
		for j := range s.Parts() {
			bpt := int64(s.PartBytesPerToken(j))
			out = append(out, Buffer{Layer: l, Part: j, Host: mem(l, j), PageStride: int64(s.PageTokens()) * bpt, TokenStride: bpt})
		}
	}
	return out
}

// AllocTokenSlotBuffers allocates TokenSlotBuffers of `slots` page slots on the Go heap.
func AllocTokenSlotBuffers(s *Shape, slots int) []Buffer {
	return TokenSlotBuffers(s, func(_, j int) []byte { return make([]byte, int64(slots)*s.ChunkBytes(j)) })
}

// BlockMajorBuffers describes vLLM-style host tensors: per layer one tensor
// [blocks, parts, P, bytes per token] (vLLM's [blocks, 2, block size, heads, head dim] for K and
// V); part j of block s at s×LayerBytes + PartOffset(j). mem(layer) returns the layer's tensor
// (at least slots × LayerBytes bytes); each part's buffer starts at its offset in it.
func BlockMajorBuffers(s *Shape, slots int, mem func(layer int) []byte) []Buffer {
	var out []Buffer
	for l := range s.Layers() {
		t := mem(l)
		for j := range s.Parts() {
			off := s.PartOffset(j)
			bpt := int64(s.PartBytesPerToken(j))
			b := t[off:]
			if need := int64(slots-1)*s.LayerBytes() + s.ChunkBytes(j); int64(len(b)) > need && need > 0 {
				b = b[:need]
			}
			out = append(out, Buffer{Layer: l, Part: j, Host: b, PageStride: s.LayerBytes(), TokenStride: bpt})
		}
	}
	return out
}
