package core

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/zeebo/blake3"
)

// BenchmarkPageIDHash compares the two candidate hashes of a page id on page-sized inputs
// (tag ‖ 32-byte previous id ‖ the page's tokens, little endian), each with a reused state
// and buffer as the core's hasher: the faster one (SHA-256 here, with SHA-NI) is the page
// id's (hash.go has the numbers). "pageid" is the core's hasher itself.
func BenchmarkPageIDHash(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32(i * 7919)
		}
		var prev PageID
		buf := make([]byte, 0, len(tagPage)+PageIDSize+4*n)
		fill := func() []byte {
			b := append(buf[:0], tagPage...)
			b = append(b, prev[:]...)
			for _, t := range toks {
				b = binary.LittleEndian.AppendUint32(b, uint32(t))
			}
			return b
		}
		b.Run(fmt.Sprintf("sha256/tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				prev = sha256.Sum256(fill())
			}
		})
		b.Run(fmt.Sprintf("blake3/tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			h := blake3.New()
			var out [32]byte
			for b.Loop() {
				h.Reset()
				h.Write(fill())
				h.Sum(out[:0])
				prev = out
			}
		})
		b.Run(fmt.Sprintf("pageid/tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var h hasher
			for b.Loop() {
				prev = h.page(prev, toks)
			}
		})
	}
}
