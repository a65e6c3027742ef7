package hicache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache/cudaengine"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/slab"
)

// pinnedSlabs is the L2 of one slab group in pinned host memory (cuda.AllocHost), shared by
// in-process ranks.
type pinnedSlabs struct {
	ranks   []int
	perSlab int
	pb      int
	buf     *cuda.HostBuffer
}

func (s *pinnedSlabs) Ranks() []int      { return s.ranks }
func (s *pinnedSlabs) PageSize() int     { return s.pb }
func (s *pinnedSlabs) PagesPerSlab() int { return s.perSlab }

func (s *pinnedSlabs) off(p slab.Page) (int, error) {
	if p.Slab < 0 || p.Slab >= len(s.ranks) || p.Index < 0 || p.Index >= s.perSlab {
		return 0, fmt.Errorf("page %v outside %d slabs × %d pages", p, len(s.ranks), s.perSlab)
	}
	return (p.Slab*s.perSlab + p.Index) * s.pb, nil
}

func (s *pinnedSlabs) Page(p slab.Page) ([]byte, error) {
	o, err := s.off(p)
	if err != nil {
		return nil, err
	}
	return s.buf.Bytes()[o : o+s.pb : o+s.pb], nil
}

func (s *pinnedSlabs) addr(p slab.Page) (cuda.DevicePtr, error) {
	o, err := s.off(p)
	return s.buf.DevicePtr().Add(o), err
}

// devL1 reads and writes a rank's device KV pool through the driver.
type devL1 struct {
	buf *cuda.DeviceBuffer
	pb  int
}

// write copies the page in and waits for the device: cuMemcpyHtoD from pageable memory may
// return before its DMA lands, and the engine's streams are non-blocking, so without the
// synchronize a backup could read the slot before the page arrives. (An engine records an
// event on its compute stream instead.)
func (d devL1) write(slot int32, fill func([]byte)) error {
	b := make([]byte, d.pb)
	fill(b)
	if err := d.buf.Write(int(slot)*d.pb, b); err != nil {
		return err
	}
	return d.buf.Device().Synchronize()
}

func (d devL1) read(slot int32) ([]byte, error) {
	b := make([]byte, d.pb)
	return b, d.buf.Read(int(slot)*d.pb, b)
}

// Four in-process CP ranks on one GPU, each with its own device L1 pool and a CUDA engine,
// sharing pinned host slabs: the random workload with every loaded page verified.
func TestGPUCUDAEngineReplicas(t *testing.T) {
	drv, dev := cudatest.RequireGPU(t)
	const n, l1Pages, perSlab, pb = 4, 64, 24, 4096
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: n, AttnCP: n})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := dev.AllocHost(n * perSlab * pb)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	slabs := &pinnedSlabs{ranks: l.SlabGroup(0), perSlab: perSlab, pb: pb, buf: hb}
	members := local.New(l.ReplicaGroup(0), local.Options{Kind: "replica", Timeout: 30 * time.Second})
	caches := make([]*Cache, n)
	engines := make([]*cudaengine.Engine, n)
	ios := make([]l1IO, n)
	for i := range n {
		buf, err := dev.Alloc(l1Pages * pb)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Close()
		if engines[i], err = cudaengine.New(dev, buf.Ptr(), l1Pages, pb, slabs.addr, cudaengine.Options{}); err != nil {
			t.Fatal(err)
		}
		defer engines[i].Close()
		ios[i] = devL1{buf, pb}
	}
	recs := make([][]stepRecord, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			c, err := New(ctx, Config{
				Options: Options{PageSize: 4, L1Pages: l1Pages, Policy: WriteThrough, MinLoadPages: 2, LoadQuotaPages: 64},
				Layout:  l, Rank: i, Group: members[i], Slabs: slabs, Engine: engines[i],
			})
			if err != nil {
				errs[i] = err
				return
			}
			caches[i] = c
			recs[i], _, errs[i] = rankWorkload(ctx, c, ios[i], 0, 600, 51, 200)
		}()
	}
	wg.Wait()
	for _, c := range caches {
		c.Close()
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := compareRecords(recs); err != nil {
		t.Fatal(err)
	}
	st := caches[0].Stats()
	if st.WrittenPages == 0 || st.LoadedPages == 0 || st.PagesWritten == 0 || st.PagesLoaded == 0 {
		t.Fatalf("GPU workload did not back up and load: %+v", st)
	}
	fmt.Printf("info: hicache GPU workload: %d ranks, %d steps in %v; driver %s batch=%q (used: %t); rank 0 copied %d pages out, %d back; %d host-hit pages\n",
		n, st.Steps, time.Since(start).Round(time.Millisecond), drv.VersionString(), drv.BatchCopyABI(), engines[0].Batched(),
		st.PagesWritten, st.PagesLoaded, st.L2HitPages)
}

// BenchmarkGPUCUDAEngineBackup: back up 64 pages of 64 KiB from device L1 to pinned host L2
// through the engine (submit + ticket; blocking-sync and spinning waiters), against the same
// copies as one raw CopyBatch and a stream synchronize, measured in the same run.
func BenchmarkGPUCUDAEngineBackup(b *testing.B) {
	_, dev := cudatest.RequireGPU(b)
	const pages, pb = 64, 64 << 10
	l1, err := dev.Alloc(pages * pb)
	if err != nil {
		b.Fatal(err)
	}
	defer l1.Close()
	hb, err := dev.AllocHost(pages * pb)
	if err != nil {
		b.Fatal(err)
	}
	defer hb.Close()
	slabs := &pinnedSlabs{ranks: []int{0}, perSlab: pages, pb: pb, buf: hb}
	e, err := cudaengine.New(dev, l1.Ptr(), pages, pb, slabs.addr, cudaengine.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	spin, err := cudaengine.New(dev, l1.Ptr(), pages, pb, slabs.addr, cudaengine.Options{Spin: true})
	if err != nil {
		b.Fatal(err)
	}
	defer spin.Close()
	t := Transfer{Kind: Write}
	var raw []cuda.Copy1
	for i := range pages {
		p := slab.Page{Slab: 0, Index: i}
		t.Copies = append(t.Copies, Copy{L1: int32(i), L2: p})
		a, _ := slabs.addr(p)
		raw = append(raw, cuda.Copy1{Dst: a, Src: l1.Ptr().Add(i * pb), Size: pb})
	}
	s, err := dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var eng, engSpin, base time.Duration
	for b.Loop() {
		start := time.Now()
		if err := e.Submit(t).Err(); err != nil {
			b.Fatal(err)
		}
		eng += time.Since(start)
		start = time.Now()
		if err := spin.Submit(t).Err(); err != nil {
			b.Fatal(err)
		}
		engSpin += time.Since(start)
		start = time.Now()
		if _, err := s.CopyBatch(raw); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		base += time.Since(start)
	}
	bytes := float64(pages*pb) * float64(b.N)
	b.ReportMetric(bytes/eng.Seconds()/1e9, "engine-GB/s")
	b.ReportMetric(bytes/engSpin.Seconds()/1e9, "spin-GB/s")
	b.ReportMetric(bytes/base.Seconds()/1e9, "raw-GB/s")
	b.ReportMetric(float64(eng)/float64(base), "x-raw")
	b.ReportMetric(float64(engSpin)/float64(base), "spin-x-raw")
}
