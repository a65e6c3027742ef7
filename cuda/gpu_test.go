package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
)

func TestMain(m *testing.M) { multiproc.Main(m) }

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed ^ byte(i>>9)
	}
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func closeT(t testing.TB, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("close %T: %v", c, err)
	}
}

func TestGPUDeviceInfo(t *testing.T) {
	drv, dev := cudatest.RequireGPU(t)
	name, err := dev.Name()
	must(t, err)
	total, err := dev.TotalMem()
	must(t, err)
	free, total2, err := dev.MemInfo()
	must(t, err)
	major, minor, err := dev.ComputeCapability()
	must(t, err)
	bus, err := dev.PCIBusID()
	must(t, err)
	sms, err := dev.Attribute(cuda.AttrMultiprocessorCount)
	must(t, err)
	uva, err := dev.Attribute(cuda.AttrUnifiedAddressing)
	must(t, err)
	fmt.Printf("info: driver %s (%d) from %s; batch copy: %q\n", drv.VersionString(), drv.Version(), drv.Path(), drv.BatchCopyABI())
	fmt.Printf("info: device 0 %q sm_%d%d, %d SMs, %.1f GiB (free %.1f GiB), pci %s, numa %d, uva %d\n",
		name, major, minor, sms, float64(total)/(1<<30), float64(free)/(1<<30), bus, cuda.NUMANode(bus), uva)
	if name == "" || total == 0 || total2 != total || free > total || major < 3 || sms <= 0 || uva != 1 {
		t.Errorf("implausible device info: name %q total %d/%d free %d cc %d.%d sms %d uva %d", name, total, total2, free, major, minor, sms, uva)
	}
	if cuda.NormalizeBusID(bus) == "" {
		t.Errorf("driver bus id %q does not normalise", bus)
	}
	if _, err := drv.Device(1 << 20); err == nil {
		t.Errorf("device ordinal 1<<20 must be rejected")
	}
}

func TestGPUAllocCopyRoundTrip(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	const n = 1<<20 + 13
	a, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, a)
	b, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, b)
	want := pattern(n, 1)
	must(t, a.Write(0, want))
	got := make([]byte, n)
	must(t, a.Read(0, got))
	if !bytes.Equal(got, want) {
		t.Fatalf("H2D/D2H round trip differs")
	}
	must(t, dev.CopyDtoD(b.Ptr(), a.Ptr(), n))
	clear(got)
	must(t, b.Read(0, got))
	if !bytes.Equal(got, want) {
		t.Fatalf("D2D copy differs")
	}
	// Partial write at an odd offset, read back through a window.
	must(t, b.Write(777, []byte("cpcache")))
	win := make([]byte, 9)
	must(t, b.Read(776, win))
	if string(win[1:8]) != "cpcache" || win[0] != want[776] || win[8] != want[784] {
		t.Errorf("windowed read = %q", win)
	}
	must(t, a.Fill(0xab))
	must(t, a.Read(0, got))
	if !bytes.Equal(got, bytes.Repeat([]byte{0xab}, n)) {
		t.Errorf("memset content wrong")
	}
	if err := a.Write(n-1, []byte{1, 2}); err == nil {
		t.Errorf("write past the end must fail")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Read(0, got[:1]); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("read after close = %v, want ErrClosed", err)
	}
}

// asyncRoundTrip sends src to the device and back into dst through stream s in several
// chunks, with a memset in between, using both typed copies and unified-address copies.
func asyncRoundTrip(t *testing.T, dev *cuda.Device, src, dst []byte, srcPtr, dstPtr cuda.DevicePtr) {
	t.Helper()
	n := len(src)
	s, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s)
	d, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, d)
	half := n / 2
	must(t, s.CopyHtoD(d.Ptr(), src[:half]))                     // typed H2D
	must(t, s.Copy(d.Ptr().Add(half), srcPtr.Add(half), n-half)) // unified H2D
	must(t, s.Memset(d.Ptr().Add(100), 0x5a, 10))
	must(t, s.CopyDtoH(dst[:half], d.Ptr()))                     // typed D2H
	must(t, s.Copy(dstPtr.Add(half), d.Ptr().Add(half), n-half)) // unified D2H
	must(t, s.Synchronize())
	want := append([]byte(nil), src...)
	copy(want[100:110], bytes.Repeat([]byte{0x5a}, 10))
	if !bytes.Equal(dst, want) {
		i := 0
		for i < n && dst[i] == want[i] {
			i++
		}
		t.Fatalf("async round trip differs at byte %d of %d", i, n)
	}
}

func TestGPUPinnedHostMemory(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	const n = 4<<20 + 4096
	src, err := dev.AllocHost(n)
	must(t, err)
	defer closeT(t, src)
	dst, err := dev.AllocHost(n)
	must(t, err)
	defer closeT(t, dst)
	copy(src.Bytes(), pattern(n, 2))
	asyncRoundTrip(t, dev, src.Bytes(), dst.Bytes(), src.DevicePtr(), dst.DevicePtr())
}

func TestGPURegisteredHostMemory(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	const n = 2 << 20
	// A shared anonymous mapping stands in for a shared-memory slab.
	mem, err := syscall.Mmap(-1, 0, 2*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
	must(t, err)
	defer syscall.Munmap(mem)
	reg, err := dev.RegisterHost(mem)
	must(t, err)
	copy(mem[:n], pattern(n, 3))
	asyncRoundTrip(t, dev, mem[:n], mem[n:], reg.DevicePtr(), reg.DevicePtr().Add(n))
	must(t, reg.Close())
	must(t, reg.Close()) // idempotent
}

func TestGPUBatchCopy(t *testing.T) {
	drv, dev := cudatest.RequireGPU(t)
	const page, pages = 4096 + 64, 96
	host, err := dev.AllocHost(page * pages)
	must(t, err)
	defer closeT(t, host)
	back, err := dev.AllocHost(page * pages)
	must(t, err)
	defer closeT(t, back)
	d, err := dev.Alloc(2 * page * pages)
	must(t, err)
	defer closeT(t, d)
	s, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s)
	copy(host.Bytes(), pattern(page*pages, 4))
	// Scatter pages to device slots in reverse order at stride 2, then gather them back.
	var up, down []cuda.Copy1
	for i := 0; i < pages; i++ {
		slot := d.Ptr().Add(2 * page * (pages - 1 - i))
		up = append(up, cuda.Copy1{Dst: slot, Src: host.DevicePtr().Add(i * page), Size: page})
		down = append(down, cuda.Copy1{Dst: back.DevicePtr().Add(i * page), Src: slot, Size: page})
	}
	for _, mode := range []string{"batch", "each"} {
		clear(back.Bytes())
		must(t, s.Memset(d.Ptr(), 0, d.Size()))
		var batched bool
		if mode == "batch" {
			b1, err := s.CopyBatch(up)
			must(t, err)
			b2, err := s.CopyBatch(down)
			must(t, err)
			batched = b1 && b2
		} else {
			must(t, s.CopyEach(up))
			must(t, s.CopyEach(down))
		}
		must(t, s.Synchronize())
		if !bytes.Equal(back.Bytes(), host.Bytes()) {
			t.Errorf("%s: gathered pages differ", mode)
		}
		if mode == "batch" {
			fmt.Printf("info: batch copy: driver %s, entry point %q, used driver batch call: %v\n", drv.VersionString(), drv.BatchCopyABI(), batched)
			if batched != (drv.BatchCopyABI() != "") {
				t.Errorf("batched=%v but driver batch ABI %q", batched, drv.BatchCopyABI())
			}
		}
	}
}

// An event recorded on a stream stays usable after the stream is closed: synchronizing and
// querying it report the work it captured done (the destroy completes the stream's work).
func TestGPUEventOutlivesItsStream(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	s, err := dev.NewStream()
	must(t, err)
	ev, err := dev.NewEvent(cuda.EventDefault)
	must(t, err)
	defer closeT(t, ev)
	const n = 4 << 10
	a, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, a)
	must(t, s.Memset(a.Ptr(), 0x22, n))
	must(t, ev.Record(s))
	must(t, s.Close())
	must(t, ev.Synchronize())
	done, err := ev.Query()
	must(t, err)
	got := make([]byte, n)
	must(t, a.Read(0, got))
	if !done || !bytes.Equal(got, bytes.Repeat([]byte{0x22}, n)) {
		t.Errorf("event done=%v after its stream closed; memset landed: %v", done, bytes.Equal(got, bytes.Repeat([]byte{0x22}, n)))
	}
}

func TestGPUEvents(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	s1, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s1)
	s2, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s2)
	start, err := dev.NewEvent(cuda.EventDefault)
	must(t, err)
	defer closeT(t, start)
	stop, err := dev.NewEvent(cuda.EventDefault)
	must(t, err)
	defer closeT(t, stop)
	const n = 8 << 20
	a, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, a)
	b, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, b)
	must(t, start.Record(s1))
	must(t, s1.Memset(a.Ptr(), 0x11, n))
	must(t, stop.Record(s1))
	// s2 copies a to b only after s1's memset: ordering through the event.
	must(t, s2.WaitEvent(stop))
	must(t, s2.CopyDtoD(b.Ptr(), a.Ptr(), n))
	must(t, s2.Synchronize())
	must(t, stop.Synchronize())
	done, err := stop.Query()
	must(t, err)
	el, err := stop.Since(start)
	must(t, err)
	if !done || el < 0 {
		t.Errorf("event done=%v elapsed=%v", done, el)
	}
	got := make([]byte, n)
	must(t, b.Read(0, got))
	if !bytes.Equal(got, bytes.Repeat([]byte{0x11}, n)) {
		t.Errorf("stream ordering through the event failed")
	}
}

const (
	envIPCMem   = "CPCACHE_TEST_IPC_MEM"
	envIPCEvent = "CPCACHE_TEST_IPC_EVENT"
	envIPCSize  = "CPCACHE_TEST_IPC_SIZE"
)

func init() { multiproc.Register("cuda-ipc-child", ipcChild) }

// ipcChild maps the parent's buffer, checks the parent's pattern, and writes its own.
func ipcChild() error {
	var mh cuda.IPCMemHandle
	var eh cuda.IPCEventHandle
	if err := mh.UnmarshalText([]byte(os.Getenv(envIPCMem))); err != nil {
		return err
	}
	if err := eh.UnmarshalText([]byte(os.Getenv(envIPCEvent))); err != nil {
		return err
	}
	n, err := strconv.Atoi(os.Getenv(envIPCSize))
	if err != nil {
		return err
	}
	drv, err := cuda.Open()
	if err != nil {
		return err
	}
	defer drv.Close()
	dev, err := drv.Device(0)
	if err != nil {
		return err
	}
	defer dev.Close()
	ev, err := dev.OpenIPCEvent(eh)
	if err != nil {
		return err
	}
	defer ev.Close()
	if err := ev.Synchronize(); err != nil { // the parent's write has landed
		return err
	}
	buf, err := dev.OpenIPC(mh, n)
	if err != nil {
		return err
	}
	got := make([]byte, n)
	if err := buf.Read(0, got); err != nil {
		return err
	}
	if !bytes.Equal(got, pattern(n, 5)) {
		return fmt.Errorf("child: parent's pattern not visible through the IPC mapping")
	}
	if err := buf.Write(0, pattern(n, 6)); err != nil {
		return err
	}
	if err := dev.Synchronize(); err != nil {
		return err
	}
	return buf.Close()
}

func TestGPUIPCAcrossProcesses(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	const n = 3<<20 + 512
	buf, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, buf)
	s, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s)
	ev, err := dev.NewEvent(cuda.EventInterprocess | cuda.EventDisableTiming)
	must(t, err)
	defer closeT(t, ev)
	host, err := dev.AllocHost(n)
	must(t, err)
	defer closeT(t, host)
	copy(host.Bytes(), pattern(n, 5))
	must(t, s.CopyHtoD(buf.Ptr(), host.Bytes()))
	must(t, ev.Record(s))
	mh, err := buf.IPCHandle()
	must(t, err)
	eh, err := ev.IPCHandle()
	must(t, err)
	mtxt, _ := mh.MarshalText()
	etxt, _ := eh.MarshalText()
	// The driver refuses to open a handle in the process that exported it; record what it says.
	if self, err := dev.OpenIPC(mh, n); err == nil {
		fmt.Printf("info: ipc: opening our own handle unexpectedly succeeded\n")
		closeT(t, self)
	} else {
		fmt.Printf("info: ipc: same-process open refused as expected: %v\n", err)
	}
	res := multiproc.Run(t, multiproc.Spec{Role: "cuda-ipc-child", N: 1, Timeout: 2 * time.Minute,
		Env: []string{envIPCMem + "=" + string(mtxt), envIPCEvent + "=" + string(etxt), envIPCSize + "=" + strconv.Itoa(n)}})
	if res[0].Err != nil {
		return
	}
	got := make([]byte, n)
	must(t, buf.Read(0, got))
	if !bytes.Equal(got, pattern(n, 6)) {
		t.Errorf("parent: child's pattern not visible in the exported buffer")
	}
}

func TestGPUTopology(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	topo, err := cuda.QueryTopology()
	if errors.Is(err, cuda.ErrNVMLUnavailable) {
		// Containers given only the compute capability do not mount libnvidia-ml.
		t.Skipf("NVML unavailable on this GPU machine (not an error: containers with only the compute capability lack it): %v", err)
	}
	if err != nil {
		t.Fatalf("NVML on a GPU machine: %v", err)
	}
	bus, err := dev.PCIBusID()
	must(t, err)
	fmt.Printf("info: nvml: driver %s, %d GPU(s)\n", topo.DriverVersion, len(topo.GPUs))
	for _, g := range topo.GPUs {
		fmt.Printf("info: nvml gpu %d %q pci %s numa %d mem %.1f GiB\n", g.Index, g.Name, g.PCIBusID, g.NUMANode, float64(g.MemoryTotal)/(1<<30))
	}
	if topo.Index(bus) < 0 {
		t.Fatalf("CUDA device 0 at %s not found among NVML GPUs", bus)
	}
	if ok, why := topo.CanShareDeviceMemory(bus, bus); !ok {
		t.Errorf("same GPU must share: %s", why)
	}
	if ok, _ := topo.CanShareDeviceMemory(bus, "0000:ff:1f.7"); ok {
		t.Errorf("an absent GPU cannot share")
	}
}

// TestGPUBandwidth prints H2D and D2H copy bandwidth for pinned memory, with pageable Go
// memory as the baseline measured in the same run. It asserts content, never speed.
func TestGPUBandwidth(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	const n, iters = 256 << 20, 8
	d, err := dev.Alloc(n)
	must(t, err)
	defer closeT(t, d)
	pinned, err := dev.AllocHost(n)
	must(t, err)
	defer closeT(t, pinned)
	pageable := make([]byte, n)
	s, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s)
	start, err := dev.NewEvent(cuda.EventDefault)
	must(t, err)
	defer closeT(t, start)
	stop, err := dev.NewEvent(cuda.EventDefault)
	must(t, err)
	defer closeT(t, stop)
	copy(pinned.Bytes(), pattern(n, 7))
	copy(pageable, pinned.Bytes())
	measure := func(what string, run func() error) float64 {
		must(t, run()) // warm-up
		must(t, s.Synchronize())
		must(t, start.Record(s))
		for i := 0; i < iters; i++ {
			must(t, run())
		}
		must(t, stop.Record(s))
		must(t, stop.Synchronize())
		el, err := stop.Since(start)
		must(t, err)
		gbs := float64(n) * iters / el.Seconds() / 1e9
		fmt.Printf("bandwidth: %-13s %d MiB x%d: %6.1f GB/s\n", what, n>>20, iters, gbs)
		return gbs
	}
	h2d := measure("H2D pinned", func() error { return s.CopyHtoD(d.Ptr(), pinned.Bytes()) })
	d2h := measure("D2H pinned", func() error { return s.CopyDtoH(pinned.Bytes(), d.Ptr()) })
	h2dp := measure("H2D pageable", func() error { return s.CopyHtoD(d.Ptr(), pageable) })
	d2hp := measure("D2H pageable", func() error { return s.CopyDtoH(pageable, d.Ptr()) })
	fmt.Printf("bandwidth: pinned/pageable ratio: H2D %.2fx, D2H %.2fx\n", h2d/h2dp, d2h/d2hp)
	if !bytes.Equal(pageable[:1<<20], pattern(n, 7)[:1<<20]) || !bytes.Equal(pinned.Bytes()[n-4096:], pattern(n, 7)[n-4096:]) {
		t.Errorf("bandwidth copies corrupted data")
	}
}
