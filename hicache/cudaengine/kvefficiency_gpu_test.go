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
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
	"github.com/cpcache/cpcache/slab"
)

// TestGPUKVCopyEfficiency measures the KV engine's chunk copies against one large pinned
// copy of the same bytes in the same run, at the Llama-3-8B shape (16-token pages: 64 chunks
// of 32 KiB) and the DeepSeek-V3 shape (64-token pages: 61 chunks of 72 KiB), page_first and
// layer_first: a backup and a layer-wise load of all pages as one step (best of three), and
// for the load the time to its layer 0 against the whole. It prints "bandwidth:" lines (the
// ratios mean something on a GPU only; the fake driver's copies are memmove) and checks every
// byte that came back; it asserts no timing.
func TestGPUKVCopyEfficiency(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	pages := 64
	if os.Getenv(fakelib.Env) != "" {
		pages = 2 // the fake driver: check the copies, do not time memmove at length
	}
	for _, m := range []struct {
		preset     string
		pageTokens int
	}{{"llama-3-8b", 16}, {"deepseek-v3", 64}} {
		lay, err := kvlayout.Preset(m.preset)
		if err != nil {
			t.Fatal(err)
		}
		for _, layerFirst := range l2Layouts {
			if err := kvCopyRound(t, dev, lay, m.preset, m.pageTokens, pages, layerFirst); err != nil {
				t.Fatalf("%s %s: %v", m.preset, l2Name(layerFirst), err)
			}
		}
	}
}

// kvCopyRound sets up token-slot L1 buffers for pages pages of layout lay (attention-TP 1)
// and a pinned L2 of one slab, and prints the rates.
func kvCopyRound(t *testing.T, dev *cuda.Device, lay kvlayout.Layout, name string, pageTokens, pages int, layerFirst bool) error {
	kv := KV{Layers: lay.NumLayers, PageTokens: pageTokens, Slots: pages, LayerFirst: layerFirst, PagesPerSlab: pages}
	for j := range lay.Parts {
		tb, err := lay.PartBytesPerToken(j, 1)
		if err != nil {
			return err
		}
		kv.TokenBytes = append(kv.TokenBytes, tb)
	}
	pb, err := lay.PageBytes(pageTokens, 1)
	if err != nil {
		return err
	}
	total := pages * int(pb)
	l1, err := dev.Alloc(total)
	if err != nil {
		return err
	}
	defer l1.Close()
	off := 0
	for range lay.NumLayers {
		for _, tb := range kv.TokenBytes {
			n := pages * pageTokens * tb
			kv.Buffers = append(kv.Buffers, Buffer{Device: l1.Ptr().Add(off), Bytes: int64(n), PageStride: int64(pageTokens * tb), TokenStride: int64(tb)})
			off += n
		}
	}
	l2, err := dev.AllocHost(total)
	if err != nil {
		return err
	}
	defer l2.Close()
	kv.L2 = func(p slab.Page) (cuda.DevicePtr, error) {
		if p.Slab != 0 || p.Index < 0 || p.Index >= pages {
			return 0, fmt.Errorf("page %v outside one slab of %d", p, pages)
		}
		return l2.DevicePtr().Add(p.Index * int(pb)), nil
	}
	e, err := NewKV(dev, kv, Options{})
	if err != nil {
		return err
	}
	defer e.Close()
	want := make([]byte, total)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	if err := l1.Write(0, want); err != nil {
		return err
	}
	if err := dev.Synchronize(); err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	d2h, err := s.CopyBandwidth(l2.DevicePtr(), l1.Ptr(), total, 3)
	if err != nil {
		return err
	}
	h2d, err := s.CopyBandwidth(l1.Ptr(), l2.DevicePtr(), total, 3)
	if err != nil {
		return err
	}
	step := func(k core.Kind) core.Transfer {
		tr := core.Transfer{Kind: k, Node: 1}
		for i := range pages {
			tr.Copies = append(tr.Copies, core.Copy{L1: int32(i), L2: slab.Page{Index: pages - 1 - i}})
		}
		return tr
	}
	var backup, load, first time.Duration
	for round := range 3 {
		start := time.Now()
		if err := e.SubmitStep([]core.Transfer{step(core.Write)})[0].Err(); err != nil {
			return err
		}
		if b := time.Since(start); round == 0 || b < backup {
			backup = b
		}
		if err := l1.Fill(0); err != nil {
			return err
		}
		if err := dev.Synchronize(); err != nil {
			return err
		}
		start = time.Now()
		tk := e.SubmitStep([]core.Transfer{step(core.Load)})[0]
		if err := tk.LayerErr(0); err != nil {
			return err
		}
		f := time.Since(start)
		if err := tk.Err(); err != nil {
			return err
		}
		if l := time.Since(start); round == 0 || l < load {
			load, first = l, f
		}
	}
	got := make([]byte, total)
	if err := l1.Read(0, got); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("the L1 loaded back differs from the L1 backed up")
	}
	gbps := func(d time.Duration) float64 { return float64(total) / d.Seconds() / 1e9 }
	fmt.Printf("bandwidth: KV chunks %s %s, %d pages of %d chunks (batched %v): backup D2H %.1f GB/s = %.2f of a large copy, load H2D %.1f GB/s = %.2f of a large copy, layer 0 of %d after %.3f of the load\n",
		name, l2Name(layerFirst), pages, lay.NumLayers*len(lay.Parts), e.Batched(), gbps(backup), gbps(backup)/d2h, gbps(load), gbps(load)/h2d, lay.NumLayers, first.Seconds()/load.Seconds())
	return nil
}
