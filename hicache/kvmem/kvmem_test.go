package kvmem

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvlayout"
)

func preset(t testing.TB, name string, attnTP, p int) *Shape {
	t.Helper()
	l, err := kvlayout.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewShape(l, attnTP, p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func small(t testing.TB) *Shape {
	t.Helper()
	l, err := kvlayout.Parse("layers=3;k=8:sharded;v=8:sharded;ix=3:replicated")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewShape(l, 2, 4) // k, v: 4 bytes per token on this rank; ix 3
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestShapeSizes(t *testing.T) {
	for _, c := range []struct {
		name          string
		tp, p, chunks int
		chunk, page   int64
	}{
		{"llama-3-8b", 1, 16, 64, 32 << 10, 2 << 20},
		{"deepseek-v3", 1, 64, 61, 72 << 10, 61 * 72 << 10},
		{"deepseek-v3", 4, 64, 61, 72 << 10, 61 * 72 << 10}, // replicated: TP does not divide it
		{"llama-3-70b", 8, 16, 160, 4 << 10, 160 * 4 << 10},
	} {
		s := preset(t, c.name, c.tp, c.p)
		if s.Chunks() != c.chunks || s.ChunkBytes(0) != c.chunk || s.PageBytes() != c.page {
			t.Errorf("%s tp%d P=%d: %d chunks of %d, page %d; want %d of %d, %d", c.name, c.tp, c.p, s.Chunks(), s.ChunkBytes(0), s.PageBytes(), c.chunks, c.chunk, c.page)
		}
	}
	if _, err := NewShape(kvlayout.Layout{}, 1, 16); !errors.Is(err, kvlayout.ErrBadLayout) {
		t.Errorf("empty layout: %v", err)
	}
	l, _ := kvlayout.Preset("llama-3-8b")
	if _, err := NewShape(l, 3, 16); !errors.Is(err, kvlayout.ErrBadLayout) || !strings.Contains(err.Error(), "attention-TP 3") {
		t.Errorf("attnTP 3 of 2048 bytes: %v", err)
	}
	if _, err := NewShape(l, 1, 0); !errors.Is(err, kvlayout.ErrBadLayout) {
		t.Errorf("0-token pages: %v", err)
	}
}

// In both L2 layouts every chunk of every page of a slab has its own bytes and together they
// tile the slab exactly; page-first pages are contiguous in layer, then part order.
func TestL2ChunkOffsetsTileTheSlab(t *testing.T) {
	s := small(t)
	const n = 5
	for _, lay := range []L2Layout{PageFirst, LayerFirst} {
		owner := make([]int, n*s.PageBytes())
		for i := range owner {
			owner[i] = -1
		}
		id := 0
		for p := range n {
			for l := range s.Layers() {
				for j := range s.Parts() {
					off, err := s.L2ChunkOffset(lay, n, p, l, j)
					if err != nil {
						t.Fatal(err)
					}
					if lay == PageFirst && off != int64(p)*s.PageBytes()+s.PageFirstOffset(l, j) {
						t.Fatalf("page-first chunk (%d,%d,%d) at %d", p, l, j, off)
					}
					if lay == LayerFirst && off != int64(l)*n*s.LayerBytes()+int64(p)*s.LayerBytes()+s.PartOffset(j) {
						t.Fatalf("layer-first chunk (%d,%d,%d) at %d", p, l, j, off)
					}
					for b := off; b < off+s.ChunkBytes(j); b++ {
						if owner[b] != -1 {
							t.Fatalf("%s: chunk (%d,%d,%d) overlaps chunk %d at byte %d", lay, p, l, j, owner[b], b)
						}
						owner[b] = id
					}
					id++
				}
			}
		}
		for b, o := range owner {
			if o == -1 {
				t.Fatalf("%s: byte %d of the slab is no chunk's", lay, b)
			}
		}
	}
	if _, err := s.L2ChunkOffset(PageFirst, n, n, 0, 0); !errors.Is(err, ErrBadL1) {
		t.Errorf("page out of range: %v", err)
	}
	if _, err := s.L2ChunkOffset(LayerFirst, n, 0, 3, 0); !errors.Is(err, ErrBadL1) {
		t.Errorf("layer out of range: %v", err)
	}
	if _, err := s.L2ChunkOffset(0, n, 0, 0, 0); !errors.Is(err, ErrBadL1) {
		t.Errorf("zero layout: %v", err)
	}
}

func TestParseL2Layout(t *testing.T) {
	for _, l := range []L2Layout{PageFirst, LayerFirst} {
		got, err := ParseL2Layout(l.String())
		if err != nil || got != l {
			t.Errorf("ParseL2Layout(%q) = %v, %v", l.String(), got, err)
		}
	}
	if _, err := ParseL2Layout("pagefirst"); !errors.Is(err, ErrBadShape) || !strings.Contains(err.Error(), `"pagefirst"`) {
		t.Errorf("bad name: %v", err)
	}
}

func wantL1Err(t *testing.T, what string, err error, layer, part int, reason string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrBadL1) {
		t.Fatalf("%s: %v, want an *Error wrapping ErrBadL1", what, err)
	}
	if e.Layer != layer || e.Part != part || !strings.Contains(e.Reason, reason) {
		t.Fatalf("%s: %v, want layer %d part %d: %q", what, err, layer, part, reason)
	}
}

func TestNewL1Rejects(t *testing.T) {
	s := small(t)
	const slots = 3
	good := func() []Buffer { return AllocTokenSlotBuffers(s, slots) }
	if _, err := NewL1(s, slots, good()); err != nil {
		t.Fatalf("token-slot buffers: %v", err)
	}
	for _, c := range []struct {
		name        string
		edit        func([]Buffer) []Buffer
		layer, part int
		reason      string
	}{
		{"no buffers", func([]Buffer) []Buffer { return nil }, -1, -1, "no buffers"},
		{"missing", func(b []Buffer) []Buffer { return append(b[:4], b[5:]...) }, 1, 1, "no buffer"},
		{"twice", func(b []Buffer) []Buffer { b[4] = b[3]; return b }, 1, 0, "described twice"},
		{"too small", func(b []Buffer) []Buffer { b[2].Host = b[2].Host[:len(b[2].Host)-1]; return b }, 0, 2, "3 slots need 36"},
		{"token stride", func(b []Buffer) []Buffer { b[1].TokenStride = 3; return b }, 0, 1, "token stride 3 below"},
		{"page stride", func(b []Buffer) []Buffer { b[1].PageStride = 15; return b }, 0, 1, "page stride 15"},
		{"no memory", func(b []Buffer) []Buffer { b[5].Host = nil; return b }, 1, 2, "neither host nor device"},
		{"both", func(b []Buffer) []Buffer { b[5].Device = 4096; return b }, 1, 2, "both host and device"},
		{"mixed", func(b []Buffer) []Buffer {
			b[5] = Buffer{Layer: 1, Part: 2, Device: 1 << 40, Bytes: 36, PageStride: 12, TokenStride: 3}
			return b
		}, 1, 2, "mixed"},
		{"bad layer", func(b []Buffer) []Buffer { b[0].Layer = 3; return b }, 3, -1, "layer out of"},
		{"overlap", func(b []Buffer) []Buffer { m := make([]byte, 60); b[6].Host, b[7].Host = m[:48], m[8:56]; return b }, 2, 1, "overlaps the buffer of layer 2 part 0"},
	} {
		_, err := NewL1(s, slots, c.edit(good()))
		wantL1Err(t, c.name, err, c.layer, c.part, c.reason)
	}
	if _, err := NewL1(s, 0, good()); !errors.Is(err, ErrBadL1) {
		t.Errorf("0 slots: %v", err)
	}
}

// vLLM's K and V of one block-major tensor interleave: their extents overlap but their
// token spans do not, which NewL1 accepts; the same tensor with V shifted by one byte into K
// is refused.
func TestBlockMajorInterleavesAndOverlapIsStrideAware(t *testing.T) {
	s := small(t)
	const slots = 4
	mem := make([][]byte, s.Layers())
	for l := range mem {
		mem[l] = make([]byte, slots*s.LayerBytes())
	}
	bufs := BlockMajorBuffers(s, slots, func(l int) []byte { return mem[l] })
	if _, err := NewL1(s, slots, bufs); err != nil {
		t.Fatalf("block-major: %v", err)
	}
	bufs[1].Host = mem[0][s.PartOffset(1)-1:] // V's first token on K's last byte
	bufs[1].Host = bufs[1].Host[:int64(slots-1)*s.LayerBytes()+s.ChunkBytes(1)]
	_, err := NewL1(s, slots, bufs)
	wantL1Err(t, "shifted V", err, 0, 1, "overlaps the buffer of layer 0 part 0")
}

// interleavedBuffers: per layer, K (part 0) and V (part 1) in disjoint columns of one
// [slots × P, kBytes + vBytes + shift] array (token stride: the row; V starts shift bytes
// after K's end); the other parts token-slot buffers of their own.
func interleavedBuffers(s *Shape, slots int, shift int64) []Buffer {
	var out []Buffer
	k, v := int64(s.PartBytesPerToken(0)), int64(s.PartBytesPerToken(1))
	ts := k + v + max(shift, 0)
	ps := ts * int64(s.PageTokens())
	for l := range s.Layers() {
		mem := make([]byte, ps*int64(slots))
		span := func(bpt int64) int64 { return int64(slots-1)*ps + int64(s.PageTokens()-1)*ts + bpt }
		out = append(out, Buffer{Layer: l, Part: 0, Host: mem[:span(k)], PageStride: ps, TokenStride: ts, TokenBytes: k},
			Buffer{Layer: l, Part: 1, Host: mem[k+shift : k+shift+span(v)], PageStride: ps, TokenStride: ts, TokenBytes: v})
		for j := 2; j < s.Parts(); j++ {
			b := int64(s.PartBytesPerToken(j))
			out = append(out, Buffer{Layer: l, Part: j, Host: make([]byte, b*int64(s.PageTokens()*slots)),
				PageStride: b * int64(s.PageTokens()), TokenStride: b, TokenBytes: b})
		}
	}
	return out
}

// K and V interleaved per token (disjoint columns of one array, one token stride) share no
// byte: NewL1 accepts them; V shifted one byte into K's columns is refused as overlapping.
func TestInterleavedColumnsAreNotAnOverlap(t *testing.T) {
	s := small(t)
	const slots = 4
	if _, err := NewL1(s, slots, interleavedBuffers(s, slots, 0)); err != nil {
		t.Fatalf("interleaved K and V: %v", err)
	}
	_, err := NewL1(s, slots, interleavedBuffers(s, slots, -1))
	wantL1Err(t, "V on K's last column", err, 0, 1, "overlaps the buffer of layer 0 part 0")
}

// A buffer whose rows (TokenBytes) are not the part's bytes per token is refused naming both
// sizes: a row twice the part would be half cached.
func TestTokenBytesMustEqualThePart(t *testing.T) {
	s := small(t) // k: 4 bytes a token on this rank
	const slots = 3
	bufs := AllocTokenSlotBuffers(s, slots)
	for i := range bufs {
		bufs[i].TokenBytes = int64(s.PartBytesPerToken(bufs[i].Part))
	}
	if _, err := NewL1(s, slots, bufs); err != nil {
		t.Fatalf("rows of the parts' sizes: %v", err)
	}
	bufs[3].TokenBytes = 8
	_, err := NewL1(s, slots, bufs)
	wantL1Err(t, "wide rows", err, 1, 0, "rows are 8 bytes a token, the part's bytes per token on this rank are 4")
}

// strided buffers: each token of a part takes 2 bytes more than the part (padding), so a
// chunk is copied token by token.
func stridedBuffers(s *Shape, slots int) []Buffer {
	var out []Buffer
	for l := range s.Layers() {
		for j := range s.Parts() {
			ts := int64(s.PartBytesPerToken(j) + 2)
			ps := ts*int64(s.PageTokens()) + 5
			out = append(out, Buffer{Layer: l, Part: j, Host: make([]byte, ps*int64(slots)), PageStride: ps, TokenStride: ts})
		}
	}
	return out
}

// A page gathered from any kind of L1 into either L2 layout and scattered back into another
// kind of L1 has every chunk's bytes where they were; the L2 bytes of a chunk are the L1
// chunk's tokens in order; ReadPageFirst of a layer-first slab gives the page-first page.
func TestGatherScatterRoundTrip(t *testing.T) {
	s := small(t)
	const slots, n = 4, 3
	rng := rand.New(rand.NewPCG(1, 2))
	mk := map[string]func() *L1{
		"token-slot": func() *L1 { l, _ := NewL1(s, slots, AllocTokenSlotBuffers(s, slots)); return l },
		"block-major": func() *L1 {
			l, _ := NewL1(s, slots, BlockMajorBuffers(s, slots, func(int) []byte { return make([]byte, slots*s.LayerBytes()) }))
			return l
		},
		"strided":     func() *L1 { l, err := NewL1(s, slots, stridedBuffers(s, slots)); _ = err; return l },
		"interleaved": func() *L1 { l, _ := NewL1(s, slots, interleavedBuffers(s, slots, 0)); return l },
	}
	for srcName, mkSrc := range mk {
		for dstName, mkDst := range mk {
			for _, lay := range []L2Layout{PageFirst, LayerFirst} {
				src, dst := mkSrc(), mkDst()
				if src == nil || dst == nil {
					t.Fatal("an L1 did not build")
				}
				for l := range s.Layers() {
					for j := range s.Parts() {
						c, _ := src.HostChunk(2, l, j)
						for i := range c {
							c[i] = byte(rng.Uint32())
						}
					}
				}
				slab := make([]byte, n*s.PageBytes())
				if err := src.Gather(2, lay, slab, n, 1); err != nil {
					t.Fatal(err)
				}
				pf := make([]byte, s.PageBytes())
				if err := s.ReadPageFirst(pf, lay, slab, n, 1); err != nil {
					t.Fatal(err)
				}
				if err := dst.Scatter(0, lay, slab, n, 1); err != nil {
					t.Fatal(err)
				}
				for l := range s.Layers() {
					for j := range s.Parts() {
						want := tokens(t, src, 2, l, j)
						if got := tokens(t, dst, 0, l, j); !bytes.Equal(got, want) {
							t.Fatalf("%s → %s → %s: chunk (%d,%d) differs", srcName, lay, dstName, l, j)
						}
						off, _ := s.L2ChunkOffset(lay, n, 1, l, j)
						if !bytes.Equal(slab[off:off+s.ChunkBytes(j)], want) {
							t.Fatalf("%s → %s: L2 chunk (%d,%d) is not the L1 chunk's tokens", srcName, lay, l, j)
						}
						po := s.PageFirstOffset(l, j)
						if !bytes.Equal(pf[po:po+s.ChunkBytes(j)], want) {
							t.Fatalf("%s: page-first chunk (%d,%d) differs", lay, l, j)
						}
					}
				}
				// WritePageFirst into the other layout, then scatter: the same chunks.
				slab2 := make([]byte, n*s.PageBytes())
				other := PageFirst + LayerFirst - lay
				if err := s.WritePageFirst(pf, other, slab2, n, 2); err != nil {
					t.Fatal(err)
				}
				dst2 := mkDst()
				if err := dst2.Scatter(3, other, slab2, n, 2); err != nil {
					t.Fatal(err)
				}
				for l := range s.Layers() {
					for j := range s.Parts() {
						if !bytes.Equal(tokens(t, dst2, 3, l, j), tokens(t, src, 2, l, j)) {
							t.Fatalf("WritePageFirst %s: chunk (%d,%d) differs", other, l, j)
						}
					}
				}
			}
		}
	}
}

// tokens is slot's chunk of (layer, part), its tokens packed.
func tokens(t *testing.T, l *L1, slot int32, layer, part int) []byte {
	t.Helper()
	c, err := l.HostChunk(slot, layer, part)
	if err != nil {
		t.Fatal(err)
	}
	b := l.Buffer(layer, part)
	bpt := int64(l.Shape().PartBytesPerToken(part))
	var out []byte
	for k := range int64(l.Shape().PageTokens()) {
		out = append(out, c[k*b.TokenStride:k*b.TokenStride+bpt]...)
	}
	return out
}

// A layer-wise scatter writes that layer's chunks and no other byte of the L1.
func TestScatterLayerTouchesOnlyItsLayer(t *testing.T) {
	s := small(t)
	const slots, n = 2, 2
	l1, err := NewL1(s, slots, AllocTokenSlotBuffers(s, slots))
	if err != nil {
		t.Fatal(err)
	}
	slab := bytes.Repeat([]byte{0xee}, n*int(s.PageBytes()))
	if err := l1.ScatterLayer(1, 1, LayerFirst, slab, n, 0); err != nil {
		t.Fatal(err)
	}
	for l := range s.Layers() {
		for j := range s.Parts() {
			for slot := range int32(slots) {
				c, _ := l1.HostChunk(slot, l, j)
				want := byte(0)
				if l == 1 && slot == 1 {
					want = 0xee
				}
				if !bytes.Equal(c, bytes.Repeat([]byte{want}, len(c))) {
					t.Fatalf("slot %d chunk (%d,%d) is not %#x", slot, l, j, want)
				}
			}
		}
	}
	if err := l1.Scatter(2, LayerFirst, slab, n, 0); !errors.Is(err, ErrBadL1) {
		t.Errorf("slot out of range: %v", err)
	}
	if err := l1.Scatter(0, LayerFirst, slab[:len(slab)-1], n, 0); !errors.Is(err, ErrBadL1) {
		t.Errorf("short slab: %v", err)
	}
}
