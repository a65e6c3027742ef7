package kvmem

import (
	"testing"
	"time"
)

// BenchmarkGatherScatter moves 256 pages between token-slot L1 buffers and an L2 slab, at the
// Llama-3-8B shape (P=16: 64 chunks of 32 KiB) and the DeepSeek-V3 shape (P=64: 61 chunks of
// 72 KiB), in both L2 layouts. vs-copy is the throughput relative to one plain copy of the same
// bytes between two contiguous buffers, measured in the same run (the issue asks >= 0.8).
func BenchmarkGatherScatter(b *testing.B) {
	const pages = 256
	for _, c := range []struct {
		preset string
		p      int
	}{{"llama-3-8b", 16}, {"deepseek-v3", 64}} {
		s := preset(b, c.preset, 1, c.p)
		l1, err := NewL1(s, pages, AllocTokenSlotBuffers(s, pages))
		if err != nil {
			b.Fatal(err)
		}
		slab := make([]byte, pages*s.PageBytes())
		plainSrc := make([]byte, len(slab))
		touch(slab)
		touch(plainSrc)
		for slot := range int32(pages) {
			for l := range s.Layers() {
				for j := range s.Parts() {
					ch, _ := l1.HostChunk(slot, l, j)
					touch(ch)
				}
			}
		}
		plain := meanNs(func() { copy(slab, plainSrc) })
		for _, lay := range []L2Layout{PageFirst, LayerFirst} {
			for _, dir := range []string{"gather", "scatter"} {
				b.Run(c.preset+"/"+lay.String()+"/"+dir, func(b *testing.B) {
					b.SetBytes(int64(len(slab)))
					for b.Loop() {
						for p := range pages {
							var err error
							if dir == "gather" {
								err = l1.Gather(int32(p), lay, slab, pages, p)
							} else {
								err = l1.Scatter(int32(p), lay, slab, pages, p)
							}
							if err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportMetric(plain/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "vs-copy")
				})
			}
		}
	}
}

// touch writes every page of b so that neither side of a copy measures page faults.
func touch(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
}

// meanNs is the mean time of f in nanoseconds over 5 calls after one warm-up call.
func meanNs(f func()) float64 {
	f()
	const n = 5
	start := time.Now()
	for range n {
		f()
	}
	return float64(time.Since(start).Nanoseconds()) / n
}
