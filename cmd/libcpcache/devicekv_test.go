package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// The device KV test's geometry: 3 layers of K (16 bytes a token) and V (32 bytes a token,
// held at a 48-byte token stride: padded rows), 4-token pages, 8 L1 slots a rank, at CP 2
// (attention-TP 1: shard 0 holds the whole of each part).
const (
	devKVSpec   = "layers=3;k=16:sharded;v=32:sharded"
	devKVLayers = 3
	devKVTokens = 4
	devKVSlots  = 8
	devKVPages  = 6 // the sequence's pages: 3 on each CP rank
)

// devKVStrides are the token strides of part 0 (K, dense) and part 1 (V, padded).
var devKVStrides = [2]int64{16, 48}

// devKVRank is one rank's device buffers and their host mirror: a host L1 of the same shape
// and strides that kvtest fills and checks, copied to and from the device buffers whole.
type devKVRank struct {
	dev    *cuda.Device
	bufs   []*cuda.DeviceBuffer // by layer × 2 + part
	mirror *kvmem.L1
	host   [][]byte
}

func newDevKVRank(t *testing.T, dev *cuda.Device) *devKVRank {
	t.Helper()
	kv, err := kvlayout.Parse(devKVSpec)
	if err != nil {
		t.Fatal(err)
	}
	shape, err := kvmem.NewShape(kv, 1, devKVTokens)
	if err != nil {
		t.Fatal(err)
	}
	r := &devKVRank{dev: dev}
	var hostBufs []kvmem.Buffer
	for l := range devKVLayers {
		for j, ts := range devKVStrides {
			size := devKVSlots * devKVTokens * ts
			b, err := dev.Alloc(int(size))
			if err != nil {
				t.Fatalf("cuMemAlloc of layer %d part %d: %v", l, j, err)
			}
			t.Cleanup(func() { _ = b.Close() })
			h := make([]byte, size)
			r.bufs, r.host = append(r.bufs, b), append(r.host, h)
			hostBufs = append(hostBufs, kvmem.Buffer{Layer: l, Part: j, Host: h, PageStride: devKVTokens * ts, TokenStride: ts})
		}
	}
	if r.mirror, err = kvmem.NewL1(shape, devKVSlots, hostBufs); err != nil {
		t.Fatal(err)
	}
	return r
}

// descs are the rank's device buffers as cpcache_l1_buffer entries (CPCACHE_MEM_DEVICE).
func (r *devKVRank) descs() []l1BufferDesc {
	return devKVDescs(func(i int) unsafe.Pointer { return devicePointer(r.bufs[i].Ptr()) })
}

// devicePointer is device address p as the void * a C caller passes: never dereferenced on
// the host, only handed back to the driver.
func devicePointer(p cuda.DevicePtr) unsafe.Pointer {
	addr := uintptr(p)
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}

// devKVDescs are CPCACHE_MEM_DEVICE entries for every (layer, part) of the test's layout, of
// devKVSlots slots each, buffer i (layer × 2 + part) at base(i).
func devKVDescs(base func(i int) unsafe.Pointer) []l1BufferDesc {
	var d []l1BufferDesc
	for i := range devKVLayers * 2 {
		ts := devKVStrides[i%2]
		d = append(d, l1BufferDesc{layer: int32(i / 2), part: int32(i % 2), kind: memDevice,
			base: base(i), bytes: devKVSlots * devKVTokens * ts, pageStride: devKVTokens * ts, tokenStride: ts})
	}
	return d
}

// toDevice copies the mirror into every device buffer; fromDevice copies layer's buffers
// back into the mirror; zero clears every device buffer (and the mirror).
func (r *devKVRank) toDevice() error {
	for i, b := range r.bufs {
		if err := b.Write(0, r.host[i]); err != nil {
			return err
		}
	}
	return nil
}

func (r *devKVRank) fromDevice(layer int) error {
	for j := range 2 {
		i := layer*2 + j
		if err := r.bufs[i].Read(0, r.host[i]); err != nil {
			return err
		}
	}
	return nil
}

func (r *devKVRank) zero() error {
	for i, b := range r.bufs {
		clear(r.host[i])
		if err := b.Fill(0); err != nil {
			return err
		}
	}
	return nil
}

// devKVConfig is rank `rank` of a CP-2 job over the file store in dir with the device buffers
// bufs on device 0 as its L1, pinned host slabs (cuMemHostRegister: they work between two
// ranks of one process, unlike CUDA IPC on a real driver) in L2 layout lay.
func devKVConfig(dir string, rank int, bufs []l1BufferDesc, lay kvmem.L2Layout) openConfig {
	c := goodConfig()
	c.layout.World, c.layout.AttnCP, c.rank = 2, 2, rank
	c.store, c.timeout = "file://"+dir, time.Minute
	c.pageTokens, c.pageBytes, c.l1Pages, c.l2Pages = devKVTokens, 0, devKVSlots, 32
	c.l1Kind, c.slabKind, c.pinHost, c.device = l1Device, slabHost, true, 0
	c.kv.kvSpec, c.kv.l1Buffers, c.kv.l2LayoutIn = devKVSpec, bufs, int(lay)
	return c
}

// onRanks runs f on ranks 0 and 1 at once (their collectives keep them in step) and joins
// their errors, each naming its rank.
func onRanks(f func(rank int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for rank := range 2 {
		wg.Go(func() {
			if err := f(rank); err != nil {
				errs[rank] = fmt.Errorf("rank %d: %w", rank, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// drain steps until nothing is in flight (Pending is replicated: both ranks step alike),
// pausing between steps so that the engine's waiters get to run on a busy machine, for at most
// a minute.
func drain(ctx context.Context, c *hicache.Cache, what string) error {
	deadline := time.Now().Add(time.Minute)
	for c.Pending() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the cache never became idle (%d transfers pending)", what, c.Pending())
		}
		if err := c.Step(ctx); err != nil {
			return err
		}
		if c.Pending() > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// devKVFlow inserts a sequence of devKVPages pages, writes this rank's pages into its device
// buffers, backs them up, evicts them from L1 and clears the buffers, loads them back and
// checks them layer by layer as each layer lands: even layers after a CUDA stream waited for
// them (cpcache_wait_l1_layer_on), odd layers after cpcache_wait_l1_layer. It returns how
// many (page, layer) chunks it checked.
func devKVFlow(ctx context.Context, s *session, r *devKVRank) (checked int, err error) {
	c := s.cache
	tokens := make([]int32, devKVPages*devKVTokens)
	for i := range tokens {
		tokens[i] = int32(1000 + 7*i)
	}
	ins, err := c.Insert(hicache.Request{Tokens: tokens})
	if err != nil {
		return 0, err
	}
	if ins.Pages != devKVPages {
		return 0, fmt.Errorf("insert cached %d pages, want %d", ins.Pages, devKVPages)
	}
	hashes := map[int]hicache.PageID{}
	for _, f := range ins.Fill {
		if f.Owner != c.CPRank() {
			continue
		}
		hashes[f.Index] = f.Hash
		if err := kvtest.FillL1Page(r.mirror, f.Slot, f.Hash.Index(), f.Index, 0); err != nil {
			return 0, err
		}
	}
	if len(hashes) != devKVPages/2 {
		return 0, fmt.Errorf("this rank filled %d pages, want %d", len(hashes), devKVPages/2)
	}
	if err := r.toDevice(); err != nil {
		return 0, err
	}
	if err := drain(ctx, c, "after the insert"); err != nil { // the write-through backups to L2
		return 0, err
	}
	if freed, _, err := c.EvictL1(devKVPages); err != nil || freed != devKVPages {
		return 0, fmt.Errorf("evict from L1: %d pages freed, %v; want %d", freed, err, devKVPages)
	}
	if err := drain(ctx, c, "after the eviction"); err != nil {
		return 0, err
	}
	if err := r.zero(); err != nil { // what loads back comes from L2, not what was left in L1
		return 0, err
	}
	m, err := c.Match(hicache.Request{Tokens: tokens})
	if err != nil || m.DevicePages != 0 || m.HostPages != devKVPages {
		return 0, fmt.Errorf("match after the eviction: %d device and %d host pages, %v; want 0 and %d", m.DevicePages, m.HostPages, err, devKVPages)
	}
	lr, err := c.LoadBack(m.Last)
	if err != nil || lr.Pages != devKVPages {
		return 0, fmt.Errorf("load back: %d pages, %v; want %d", lr.Pages, err, devKVPages)
	}
	if err := c.Step(ctx); err != nil { // starts the loads
		return 0, err
	}
	if m, err = c.Match(hicache.Request{Tokens: tokens}); err != nil || m.DevicePages != devKVPages {
		return 0, fmt.Errorf("match after the load back: %d device pages, %v; want %d", m.DevicePages, err, devKVPages)
	}
	stream, err := r.dev.NewStream()
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, stream.Close()) }()
	for layer := range devKVLayers {
		how := "cpcache_wait_l1_layer"
		if layer%2 == 0 {
			how = "cpcache_wait_l1_layer_on"
			if err := c.WaitL1LayerOn(m.Last, layer, stream.Handle()); err != nil {
				return checked, fmt.Errorf("%s, layer %d: %w", how, layer, err)
			}
			if err := stream.Synchronize(); err != nil {
				return checked, err
			}
		} else if err := c.WaitL1Layer(ctx, m.Last, layer); err != nil {
			return checked, fmt.Errorf("%s, layer %d: %w", how, layer, err)
		}
		if err := r.fromDevice(layer); err != nil {
			return checked, err
		}
		for idx, slot := range m.L1Slots {
			if !c.Owns(idx) {
				continue
			}
			if slot < 0 {
				return checked, fmt.Errorf("page %d is this rank's but has no L1 slot", idx)
			}
			if err := kvtest.CheckL1Layer(r.mirror, slot, layer, hashes[idx].Index(), idx, 0); err != nil {
				return checked, fmt.Errorf("after %s: %w", how, err)
			}
			checked++
		}
	}
	return checked, drain(ctx, c, "after the load")
}

// TestGPUDeviceKVBuffers: cpcache_open with per-layer L1 buffers in device memory (cuMemAlloc;
// CPCACHE_MEM_DEVICE, l1_kind CPCACHE_L1_DEVICE) on two CP ranks, in either L2 layout: the
// CUDA engine backs each rank's pages up from its device buffers, and after an eviction (and
// the buffers cleared) loads them back layer by layer, every chunk of each layer where the
// rank's buffers (strided: V rows padded) want it once that layer's wait returns.
func TestGPUDeviceKVBuffers(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	for _, lay := range []kvmem.L2Layout{kvmem.PageFirst, kvmem.LayerFirst} {
		t.Run(lay.String(), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			ranks := [2]*devKVRank{newDevKVRank(t, dev), newDevKVRank(t, dev)}
			var sessions [2]*session
			err := onRanks(func(rank int) error {
				c := devKVConfig(dir, rank, ranks[rank].descs(), lay)
				s, err := openSession(ctx, &c, 0)
				sessions[rank] = s
				return err
			})
			defer func() {
				if err := onRanks(func(rank int) error {
					if sessions[rank] == nil {
						return nil
					}
					return sessions[rank].close()
				}); err != nil {
					t.Error(err)
				}
			}()
			if err != nil {
				t.Fatal(err)
			}
			for rank, s := range sessions {
				if s.engine != nil || s.l1Base != nil || s.info.cpSize != 2 || s.info.kvPageBytes != 3*4*(16+32) {
					t.Fatalf("rank %d: host engine %v, host L1 %p, CP %d, KV page bytes %d; want no host engine or L1, CP 2, %d",
						rank, s.engine != nil, s.l1Base, s.info.cpSize, s.info.kvPageBytes, 3*4*(16+32))
				}
			}
			var checked [2]int
			if err := onRanks(func(rank int) (err error) {
				checked[rank], err = devKVFlow(ctx, sessions[rank], ranks[rank])
				return err
			}); err != nil {
				t.Fatal(err)
			}
			for rank, n := range checked {
				if n != devKVPages/2*devKVLayers {
					t.Errorf("rank %d checked %d (page, layer) chunks, want %d", rank, n, devKVPages/2*devKVLayers)
				}
			}
		})
	}
}

// TestFakeDriverRunsDeviceKVBuffers runs TestGPUDeviceKVBuffers against the host-memory fake of
// libcuda (csrc/cuda_fake.c): its device memory is memfd mappings, its copies memmove.
func TestFakeDriverRunsDeviceKVBuffers(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunTests(t, "^TestGPUDeviceKVBuffers$", "", "CPCACHE_CUDA_LIBRARY="+lib)
	for _, want := range []string{"--- PASS: TestGPUDeviceKVBuffers/page_first", "--- PASS: TestGPUDeviceKVBuffers/layer_first"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q missing: the device KV test did not pass on the fake driver:\n%s", want, out)
		}
	}
}

// TestDeviceKVBuffersWithoutCUDA runs TestChildDeviceKVBuffersWithoutCUDA in a child process
// whose CUDA driver cannot load (CPCACHE_CUDA_LIBRARY names a missing file; a process that
// loaded a driver keeps it).
func TestDeviceKVBuffersWithoutCUDA(t *testing.T) {
	fakelib.SkipInChild(t)
	out := fakelib.RunTests(t, "^TestChildDeviceKVBuffersWithoutCUDA$", "", "CPCACHE_CUDA_LIBRARY="+filepath.Join(t.TempDir(), "no-libcuda.so.1"))
	if !strings.Contains(out, "--- PASS: TestChildDeviceKVBuffersWithoutCUDA") {
		t.Errorf("the no-CUDA test did not pass in the child:\n%s", out)
	}
}

// TestChildDeviceKVBuffersWithoutCUDA: device buffers on ranks whose CUDA driver cannot load
// fail the open of both ranks, in the agreed CUDA step, with CPCACHE_ERR_CONFIG and an error
// naming the buffers (the first one's layer and part) and the driver's cause, not a lost peer.
func TestChildDeviceKVBuffersWithoutCUDA(t *testing.T) {
	if os.Getenv(fakelib.Env) == "" {
		t.Skip("run by TestDeviceKVBuffersWithoutCUDA in a child process whose CUDA driver cannot load")
	}
	dir := t.TempDir()
	var errs [2]error
	_ = onRanks(func(rank int) error {
		// Host memory stands in for the device's: no copy runs without a driver.
		c := devKVConfig(dir, rank, devKVDescs(func(i int) unsafe.Pointer {
			return unsafe.Pointer(unsafe.SliceData(make([]byte, devKVSlots*devKVTokens*devKVStrides[i%2])))
		}), kvmem.PageFirst)
		s, err := openSession(context.Background(), &c, 0)
		if s != nil {
			_ = s.close()
			err = errors.New("opened without CUDA")
		}
		errs[rank] = err
		return nil
	})
	for rank, err := range errs {
		t.Logf("rank %d: status %d: %v", rank, statusOf(err), err)
		if err == nil || !strings.Contains(err.Error(), "the 6 device L1 buffers (the first: layer 0 part 0) on device 0") ||
			!strings.Contains(err.Error(), "no-libcuda.so.1") || !strings.Contains(err.Error(), "opening CUDA") {
			t.Errorf("rank %d: %v; want the CUDA step's failure naming the device L1 buffers and the library", rank, err)
		}
		if got := statusOf(err); got != -6 {
			t.Errorf("rank %d: status %d, want CPCACHE_ERR_CONFIG (-6): this machine cannot serve device buffers", rank, got)
		}
	}
}
