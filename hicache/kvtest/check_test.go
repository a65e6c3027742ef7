package kvtest

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/mix"
)

// checkKVBytewise is the naive model of CheckKV: every byte against its expected byte.
func checkKVBytewise(b []byte, pageHash uint64, index, shard int) error {
	x := seed(pageHash, index, shard)
	var want [8]byte
	for i := 0; i < len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(want[:], mix.Mix64(x))
		for j := 0; j < 8 && i+j < len(b); j++ {
			if b[i+j] != want[j] {
				return fmt.Errorf("kvtest: page %d (hash %#x, shard %d): byte %d is %#02x, want %#02x", index, pageHash, shard, i+j, b[i+j], want[j])
			}
		}
	}
	return nil
}

// FuzzCheckKVMatchesBytewise: on any page size and any damage (a byte at any offset changed
// to any value), the word-wise check gives exactly the naive check's verdict and message.
func FuzzCheckKVMatchesBytewise(f *testing.F) {
	f.Add(uint64(0xabc), uint16(4099), uint16(4098), byte(1))
	f.Add(uint64(1), uint16(7), uint16(0), byte(0x80))
	f.Add(uint64(2), uint16(64), uint16(63), byte(0))
	f.Fuzz(func(t *testing.T, hash uint64, size, at uint16, flip byte) {
		b := make([]byte, size)
		FillKV(b, hash, 3, 1)
		if size > 0 {
			b[int(at)%int(size)] ^= flip
		}
		got, want := CheckKV(b, hash, 3, 1), checkKVBytewise(b, hash, 3, 1)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("size %d, byte %d ^= %#x: CheckKV says %v, the byte-wise check %v", size, at, flip, got, want)
		}
	})
}

// BenchmarkCheckKV checks a 64 KiB page (a 16-token page of a model with 4 KiB of KV per
// token and rank) word-wise and byte-wise; x-fill is each against FillKV of the same bytes,
// the cost of making the content.
func BenchmarkCheckKV(b *testing.B) {
	page := make([]byte, 64<<10)
	FillKV(page, 0xabc, 5, 1)
	fill := benchNs(func() { FillKV(page, 0xabc, 5, 1) })
	for _, c := range []struct {
		name  string
		check func([]byte, uint64, int, int) error
	}{{"words", CheckKV}, {"bytes", checkKVBytewise}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(page)))
			for b.Loop() {
				if err := c.check(page, 0xabc, 5, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/fill, "x-fill")
		})
	}
}

// benchNs is the mean time of f in nanoseconds over 200 calls (the baseline of a ratio).
func benchNs(f func()) float64 {
	const n = 200
	start := time.Now()
	for range n {
		f()
	}
	return float64(time.Since(start).Nanoseconds()) / n
}
