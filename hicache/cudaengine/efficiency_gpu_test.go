package cudaengine

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
	"github.com/cpcache/cpcache/slab"
)

// TestGPUPageCopyEfficiency measures how close the CUDA engine's page copies come to the
// bus: 64 MiB each way in transfers of 64 pages of 16, 64 and 256 KiB (best of three)
// between a device L1 pool and pinned host L2 pages (addressed by the device pointer of the
// pinned memory), with blocking and spinning completion and 1 or 4 streams per direction,
// against one large pinned copy of each direction in the same run; the transfers are
// submitted one by one (a copy call each) or as a step (SubmitStep: a call per stream).
// It prints "bandwidth:" lines with the ratios (meaningful on a GPU only; the fake driver's
// copies are memmove) and checks every byte that moved; it asserts no timing.
func TestGPUPageCopyEfficiency(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	large := 64 << 20
	if os.Getenv(fakelib.Env) != "" {
		large = 1 << 20 // the fake driver: check the copies, do not time memmove at length
	}
	d2h, h2d, err := largePinnedCopyGBps(dev, large)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("bandwidth: large pinned copy %d MiB: D2H %.1f GB/s, H2D %.1f GB/s\n", large>>20, d2h, h2d)
	const pages = 64
	for _, pb := range []int{16 << 10, 64 << 10, 256 << 10} {
		transfers := max(large/(pages*pb), 1)
		for _, step := range []bool{false, true} {
			for _, o := range []Options{{}, {Spin: true}, {Streams: 4}, {Spin: true, Streams: 4}} {
				w, l, batched, err := pageCopyGBps(dev, pb, pages, transfers, o, step)
				if err != nil {
					t.Fatalf("%d KiB pages, %+v, step %v: %v", pb>>10, o, step, err)
				}
				fmt.Printf("bandwidth: page copies %3d KiB x %d x %3d transfers (step %-5v spin %-5v streams %d batched %v): backup D2H %.1f GB/s = %.2f of large, load H2D %.1f GB/s = %.2f of large\n",
					pb>>10, pages, transfers, step, o.Spin, max(o.Streams, 1), batched, w, w/d2h, l, l/h2d)
			}
		}
	}
}

// largePinnedCopyGBps is the best of three copies of n bytes each way between device
// memory and pinned host memory.
func largePinnedCopyGBps(dev *cuda.Device, n int) (d2h, h2d float64, err error) {
	d, err := dev.Alloc(n)
	if err != nil {
		return 0, 0, err
	}
	defer d.Close()
	h, err := dev.AllocHost(n)
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	s, err := dev.NewStream()
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	best := func(dst, src cuda.DevicePtr) (float64, error) { return s.CopyBandwidth(dst, src, n, 3) }
	if d2h, err = best(h.DevicePtr(), d.Ptr()); err != nil {
		return 0, 0, err
	}
	h2d, err = best(d.Ptr(), h.DevicePtr())
	return d2h, h2d, err
}

// pageCopyGBps backs up and loads back transfers of pages pages of pb bytes through a
// CUDAEngine, all submitted back to back or (step) in one SubmitStep, and returns each
// direction's best bandwidth of three rounds, from the first Submit to the last completion.
// The pages that come back must equal the pages that went out.
func pageCopyGBps(dev *cuda.Device, pb, pages, transfers int, opts Options, step bool) (write, load float64, batched bool, err error) {
	n := pages * transfers
	pool, err := newTestPool(dev, n, pb, opts)
	if err != nil {
		return 0, 0, false, err
	}
	defer pool.Close()
	l1, e := pool.l1, pool.e
	want := make([]byte, n*pb)
	for i := range want {
		want[i] = byte(i*7 + i/pb)
	}
	if err := l1.Write(0, want); err != nil {
		return 0, 0, false, err
	}
	if err := dev.Synchronize(); err != nil {
		return 0, 0, false, err
	}
	run := func(k core.Kind) (float64, error) {
		var top float64
		for range 3 {
			gbps, err := round(e, k, pb, pages, transfers, step)
			if err != nil {
				return 0, err
			}
			top = max(top, gbps)
		}
		return top, nil
	}
	if write, err = run(core.Write); err != nil {
		return 0, 0, false, err
	}
	batched = e.Batched()
	if err := l1.Fill(0); err != nil {
		return 0, 0, false, err
	}
	if err := dev.Synchronize(); err != nil { // a memset may return before it lands
		return 0, 0, false, err
	}
	if load, err = run(core.Load); err != nil {
		return 0, 0, false, err
	}
	got := make([]byte, n*pb)
	if err := l1.Read(0, got); err != nil {
		return 0, 0, false, err
	}
	if !bytes.Equal(got, want) {
		return 0, 0, false, fmt.Errorf("pages loaded back differ from the pages backed up")
	}
	return write, load, batched, nil
}

// round submits transfers transfers of pages pages (L1 slot s ↔ L2 page n-1-s, a scatter as
// the allocator's choices are) back to back, or as one step, and returns GB/s to the last
// completion.
func round(e *Engine, k core.Kind, pb, pages, transfers int, step bool) (float64, error) {
	n := pages * transfers
	trs := make([]core.Transfer, transfers)
	for i := range trs {
		trs[i] = core.Transfer{Kind: k, Seq: uint64(i), Node: uint64(i)}
		for j := range pages {
			slot := i*pages + j
			trs[i].Copies = append(trs[i].Copies, core.Copy{L1: int32(slot), L2: slab.Page{Index: n - 1 - slot}})
		}
	}
	start := time.Now()
	var tks []*engine.Ticket
	if step {
		tks = e.SubmitStep(trs)
	} else {
		for _, tr := range trs {
			tks = append(tks, e.Submit(tr))
		}
	}
	for _, tk := range tks {
		if err := tk.Err(); err != nil {
			return 0, err
		}
	}
	return float64(n*pb) / time.Since(start).Seconds() / 1e9, nil
}
