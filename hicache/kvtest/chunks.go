package kvtest

import (
	"encoding/binary"
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/internal/mix"
)

// The content of a layered page: each chunk (layer, part) of sequence page index (chained hash
// pageHash) on TP shard `shard` is its own stream of 64-bit words, word w of the chunk (its
// bytes 8w..8w+7, little-endian) being chunkWord(chunkSeed(...), w). A word is a function of
// its position, so a chunk split into strided tokens fills and checks token by token, and a
// chunk that landed at another layer's or part's place, or a shifted one, is caught.

func chunkSeed(pageHash uint64, index, layer, part, shard int) uint64 {
	return mix.Mix64(seed(pageHash, index, shard) ^ mix.Mix64(uint64(layer)<<20|uint64(part)+0x2545f4914f6cdd1d))
}

func chunkWord(s uint64, w int64) uint64 { return mix.Mix64(s + uint64(w+1)*0x9e3779b97f4a7c15) }

// fillAt writes bytes [off, off+len(dst)) of the chunk stream s into dst.
func fillAt(dst []byte, s uint64, off int64) {
	i := 0
	if r := int(off % 8); r != 0 { // leading partial word
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], chunkWord(s, off/8))
		i = copy(dst, w[r:])
	}
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], chunkWord(s, (off+int64(i))/8))
	}
	if i < len(dst) {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], chunkWord(s, (off+int64(i))/8))
		copy(dst[i:], w[:])
	}
}

// checkAt returns the chunk offset of the first byte of b that is not byte off+i of the
// stream s, and the byte wanted, or -1 if none. Whole words are compared.
func checkAt(b []byte, s uint64, off int64) (int64, byte) {
	var w [8]byte
	i := 0
	if r := int(off % 8); r != 0 {
		binary.LittleEndian.PutUint64(w[:], chunkWord(s, off/8))
		for j := 0; j < 8-r && j < len(b); j++ {
			if b[j] != w[r+j] {
				return off + int64(j), w[r+j]
			}
		}
		i = min(8-r, len(b))
	}
	for ; i+8 <= len(b); i += 8 {
		want := chunkWord(s, (off+int64(i))/8)
		if binary.LittleEndian.Uint64(b[i:]) != want {
			binary.LittleEndian.PutUint64(w[:], want)
			for j := range 8 {
				if b[i+j] != w[j] {
					return off + int64(i+j), w[j]
				}
			}
		}
	}
	if i < len(b) {
		binary.LittleEndian.PutUint64(w[:], chunkWord(s, (off+int64(i))/8))
		for j := range len(b) - i {
			if b[i+j] != w[j] {
				return off + int64(i+j), w[j]
			}
		}
	}
	return -1, 0
}

// FillChunk writes the content of chunk (layer, part) of sequence page index (hash pageHash)
// for TP shard `shard` into dst (the chunk's packed bytes: P tokens of the part).
func FillChunk(dst []byte, pageHash uint64, index, layer, part, shard int) {
	fillAt(dst, chunkSeed(pageHash, index, layer, part, shard), 0)
}

// ChunkError is a layered page's first bad byte: the chunk (Layer, Part) and the byte's
// offset in the chunk's packed bytes.
type ChunkError struct {
	Index, Shard int
	PageHash     uint64
	Layer, Part  int
	PartName     string
	Offset       int64
	Got, Want    byte
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("kvtest: page %d (hash %#x, shard %d): layer %d part %d (%q): byte %d is %#02x, want %#02x",
		e.Index, e.PageHash, e.Shard, e.Layer, e.Part, e.PartName, e.Offset, e.Got, e.Want)
}

// eachToken calls f with token k's bytes of slot's chunk (layer, part) and their offset in
// the chunk's packed bytes; a contiguous chunk is one call.
func eachToken(l1 *kvmem.L1, slot int32, layer, part int, f func(b []byte, off int64)) error {
	c, err := l1.HostChunk(slot, layer, part)
	if err != nil {
		return err
	}
	s := l1.Shape()
	if l1.Contiguous(layer, part) {
		f(c, 0)
		return nil
	}
	bpt := int64(s.PartBytesPerToken(part))
	ts := l1.Buffer(layer, part).TokenStride
	for k := range int64(s.PageTokens()) {
		f(c[k*ts:k*ts+bpt], k*bpt)
	}
	return nil
}

// FillL1Page writes the content of sequence page index (hash pageHash, TP shard `shard`) into
// slot of a host L1: every chunk, token by token where the buffer is strided.
func FillL1Page(l1 *kvmem.L1, slot int32, pageHash uint64, index, shard int) error {
	s := l1.Shape()
	for layer := range s.Layers() {
		for part := range s.Parts() {
			cs := chunkSeed(pageHash, index, layer, part, shard)
			if err := eachToken(l1, slot, layer, part, func(b []byte, off int64) { fillAt(b, cs, off) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckL1Page verifies that slot of a host L1 holds FillL1Page's content; the error is a
// *ChunkError naming the first bad byte's layer, part and offset.
func CheckL1Page(l1 *kvmem.L1, slot int32, pageHash uint64, index, shard int) error {
	for layer := range l1.Shape().Layers() {
		if err := CheckL1Layer(l1, slot, layer, pageHash, index, shard); err != nil {
			return err
		}
	}
	return nil
}

// CheckL1Layer is CheckL1Page for one layer's chunks: what a layer's attention reads once a
// layer-wise load says that layer landed.
func CheckL1Layer(l1 *kvmem.L1, slot int32, layer int, pageHash uint64, index, shard int) error {
	s := l1.Shape()
	if layer < 0 || layer >= s.Layers() {
		return fmt.Errorf("kvtest: layer %d outside the %d layers of the L1", layer, s.Layers())
	}
	for part := range s.Parts() {
		cs := chunkSeed(pageHash, index, layer, part, shard)
		var bad *ChunkError
		err := eachToken(l1, slot, layer, part, func(b []byte, off int64) {
			if bad != nil {
				return
			}
			if at, want := checkAt(b, cs, off); at >= 0 {
				bad = &ChunkError{Index: index, Shard: shard, PageHash: pageHash, Layer: layer, Part: part,
					PartName: s.PartName(part), Offset: at, Got: b[at-off], Want: want}
			}
		})
		if err != nil {
			return err
		}
		if bad != nil {
			return bad
		}
	}
	return nil
}

// CheckChunk verifies the packed bytes b of chunk (layer, part) of a page of shape s against
// FillChunk (a *ChunkError names the first bad byte's offset in the chunk): a chunk read back
// from device memory.
func CheckChunk(b []byte, s *kvmem.Shape, pageHash uint64, index, layer, part, shard int) error {
	if int64(len(b)) != s.ChunkBytes(part) {
		return fmt.Errorf("kvtest: page %d layer %d part %d: %d bytes, a chunk has %d", index, layer, part, len(b), s.ChunkBytes(part))
	}
	if at, want := checkAt(b, chunkSeed(pageHash, index, layer, part, shard), 0); at >= 0 {
		return &ChunkError{Index: index, Shard: shard, PageHash: pageHash, Layer: layer, Part: part,
			PartName: s.PartName(part), Offset: at, Got: b[at], Want: want}
	}
	return nil
}

// FillPageFirst writes the page-first bytes of the page (its L3 value, an L2 page-first page)
// into dst, PageBytes of shape long.
func FillPageFirst(dst []byte, s *kvmem.Shape, pageHash uint64, index, shard int) {
	for layer := range s.Layers() {
		for part := range s.Parts() {
			o := s.PageFirstOffset(layer, part)
			FillChunk(dst[o:o+s.ChunkBytes(part)], pageHash, index, layer, part, shard)
		}
	}
}

// CheckPageFirst verifies page-first bytes against FillPageFirst (a *ChunkError names the
// first bad byte's layer, part and offset in the chunk).
func CheckPageFirst(b []byte, s *kvmem.Shape, pageHash uint64, index, shard int) error {
	if int64(len(b)) != s.PageBytes() {
		return fmt.Errorf("kvtest: page %d (hash %#x): %d bytes, a page has %d", index, pageHash, len(b), s.PageBytes())
	}
	for layer := range s.Layers() {
		for part := range s.Parts() {
			o := s.PageFirstOffset(layer, part)
			c := b[o : o+s.ChunkBytes(part)]
			if at, want := checkAt(c, chunkSeed(pageHash, index, layer, part, shard), 0); at >= 0 {
				return &ChunkError{Index: index, Shard: shard, PageHash: pageHash, Layer: layer, Part: part,
					PartName: s.PartName(part), Offset: at, Got: c[at], Want: want}
			}
		}
	}
	return nil
}
