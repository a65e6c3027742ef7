package kvtest

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
)

func testShape(t testing.TB) *kvmem.Shape {
	t.Helper()
	l, err := kvlayout.Parse("layers=4;k=16:sharded;v=16:sharded;ix=3:replicated")
	if err != nil {
		t.Fatal(err)
	}
	s, err := kvmem.NewShape(l, 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Swapping two layers' chunks of one part (same size, each a valid chunk of the page) is a
// bad page, named at the first swapped layer; so is a page of another hash, index or shard.
func TestSwappedLayersFailTheCheck(t *testing.T) {
	s := testShape(t)
	page := make([]byte, s.PageBytes())
	FillPageFirst(page, s, 0xabc, 3, 1)
	if err := CheckPageFirst(page, s, 0xabc, 3, 1); err != nil {
		t.Fatalf("own content rejected: %v", err)
	}
	for _, other := range [][3]int{{0xabd, 3, 1}, {0xabc, 4, 1}, {0xabc, 3, 0}} {
		if CheckPageFirst(page, s, uint64(other[0]), other[1], other[2]) == nil {
			t.Fatalf("content accepted as %v", other)
		}
	}
	a, b := s.PageFirstOffset(1, 1), s.PageFirstOffset(2, 1)
	n := s.ChunkBytes(1)
	tmp := append([]byte(nil), page[a:a+n]...)
	copy(page[a:a+n], page[b:b+n])
	copy(page[b:b+n], tmp)
	err := CheckPageFirst(page, s, 0xabc, 3, 1)
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Layer != 1 || ce.Part != 1 || ce.PartName != "v" || ce.Offset != 0 {
		t.Fatalf("layers 1 and 2 of v swapped: %v, want layer 1 part 1 byte 0", err)
	}
	// Swapping parts k and v of one layer fails too.
	FillPageFirst(page, s, 0xabc, 3, 1)
	k, v := s.PageFirstOffset(0, 0), s.PageFirstOffset(0, 1)
	copy(tmp, page[k:k+n])
	copy(page[k:k+n], page[v:v+n])
	copy(page[v:v+n], tmp)
	if err := CheckPageFirst(page, s, 0xabc, 3, 1); !errors.As(err, &ce) || ce.Layer != 0 || ce.Part != 0 {
		t.Fatalf("k and v swapped: %v", err)
	}
}

// A page filled in a strided L1 (tokens 3 bytes apart beyond the part), gathered to a
// layer-first slab and read back page-first, checks; a byte changed in the L1 is named by
// layer, part and offset within the chunk.
func TestL1PageFillCheckThroughGather(t *testing.T) {
	s := testShape(t)
	const slots = 3
	var bufs []kvmem.Buffer
	for l := range s.Layers() {
		for j := range s.Parts() {
			ts := int64(s.PartBytesPerToken(j) + 3)
			bufs = append(bufs, kvmem.Buffer{Layer: l, Part: j, Host: make([]byte, ts*int64(s.PageTokens())*slots), PageStride: ts * int64(s.PageTokens()), TokenStride: ts})
		}
	}
	l1, err := kvmem.NewL1(s, slots, bufs)
	if err != nil {
		t.Fatal(err)
	}
	if err := FillL1Page(l1, 1, 0x77, 9, 0); err != nil {
		t.Fatal(err)
	}
	if err := CheckL1Page(l1, 1, 0x77, 9, 0); err != nil {
		t.Fatalf("own content rejected: %v", err)
	}
	slab := make([]byte, 2*s.PageBytes())
	if err := l1.Gather(1, kvmem.LayerFirst, slab, 2, 1); err != nil {
		t.Fatal(err)
	}
	pf := make([]byte, s.PageBytes())
	if err := s.ReadPageFirst(pf, kvmem.LayerFirst, slab, 2, 1); err != nil {
		t.Fatal(err)
	}
	if err := CheckPageFirst(pf, s, 0x77, 9, 0); err != nil {
		t.Fatalf("gathered page: %v", err)
	}
	c, _ := l1.HostChunk(1, 2, 2) // ix: 3 bytes per token, stride 6: token 3 byte 1 is chunk byte 10
	c[3*6+1] ^= 0x40
	err = CheckL1Page(l1, 1, 0x77, 9, 0)
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Layer != 2 || ce.Part != 2 || ce.PartName != "ix" || ce.Offset != 10 || ce.Got^ce.Want != 0x40 {
		t.Fatalf("changed byte: %v, want layer 2 part 2 byte 10", err)
	}
	// Layer by layer: the other layers still check, layer 2 names the byte, a layer outside
	// the shape is an error.
	for l := range s.Layers() {
		err := CheckL1Layer(l1, 1, l, 0x77, 9, 0)
		if l == 2 {
			if !errors.As(err, &ce) || ce.Layer != 2 || ce.Offset != 10 {
				t.Fatalf("layer 2: %v, want the changed byte", err)
			}
		} else if err != nil {
			t.Fatalf("layer %d: %v", l, err)
		}
	}
	if err := CheckL1Layer(l1, 1, s.Layers(), 0x77, 9, 0); err == nil {
		t.Fatal("a layer beyond the shape checked")
	}
	// One packed chunk: FillChunk's content checks, a changed byte is named, another
	// layer's chunk and a short chunk are errors.
	chunk := make([]byte, s.ChunkBytes(1))
	FillChunk(chunk, 0x77, 9, 1, 1, 0)
	if err := CheckChunk(chunk, s, 0x77, 9, 1, 1, 0); err != nil {
		t.Fatalf("own chunk rejected: %v", err)
	}
	if err := CheckChunk(chunk, s, 0x77, 9, 0, 1, 0); err == nil {
		t.Fatal("layer 1's chunk checked as layer 0's")
	}
	chunk[5] ^= 1
	if err := CheckChunk(chunk, s, 0x77, 9, 1, 1, 0); !errors.As(err, &ce) || ce.Offset != 5 || ce.Layer != 1 {
		t.Fatalf("changed chunk byte: %v, want byte 5 of layer 1", err)
	}
	if err := CheckChunk(chunk[1:], s, 0x77, 9, 1, 1, 0); err == nil {
		t.Fatal("a short chunk checked")
	}
}

// bytewiseAt is the naive model of checkAt: every byte against its word's byte.
func bytewiseAt(b []byte, s uint64, off int64) (int64, byte) {
	for i := range b {
		o := off + int64(i)
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], chunkWord(s, o/8))
		if b[i] != w[o%8] {
			return o, w[o%8]
		}
	}
	return -1, 0
}

// FuzzChunkCheckMatchesBytewise: for any window (offset, length) of a chunk stream, the
// word-wise fill then check accepts, fillAt agrees with the byte-wise model, and any damage is
// reported exactly where the byte-wise model reports it.
func FuzzChunkCheckMatchesBytewise(f *testing.F) {
	f.Add(uint64(1), uint16(0), uint16(64), uint16(5), byte(1))
	f.Add(uint64(2), uint16(3), uint16(7), uint16(6), byte(0x80))
	f.Add(uint64(3), uint16(13), uint16(1), uint16(0), byte(0))
	f.Fuzz(func(t *testing.T, s uint64, off, size, at uint16, flip byte) {
		b := make([]byte, size)
		fillAt(b, s, int64(off))
		if got, _ := bytewiseAt(b, s, int64(off)); got != -1 {
			t.Fatalf("fillAt(off %d, %d bytes) differs from the model at %d", off, size, got)
		}
		if size > 0 {
			b[int(at)%int(size)] ^= flip
		}
		g, gw := checkAt(b, s, int64(off))
		w, ww := bytewiseAt(b, s, int64(off))
		if g != w || gw != ww {
			t.Fatalf("off %d size %d byte %d ^= %#x: checkAt (%d, %#x), model (%d, %#x)", off, size, at, flip, g, gw, w, ww)
		}
	})
}
