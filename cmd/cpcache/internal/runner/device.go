package runner

import (
	"errors"
	"fmt"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/cudaengine"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/slab"
)

// Memory kinds of Config.Device and Config.L2.
const (
	DeviceHost = "host" // L1 and L2 in host memory, copies by goroutines (the default)
	DeviceCUDA = "cuda" // L1 in device memory, copies through the CUDA engine
	L2Device   = "device"
	L2Host     = "host"
)

// checkDevice validates the memory options (Prepare calls it) and fills in their defaults.
// CUDADevice means nothing to a host run (so a zero Config is a valid host run); the command
// rejects --cuda-device without --device cuda itself.
func (c *Config) checkDevice() error {
	switch c.Device {
	case "", DeviceHost:
		c.Device = DeviceHost
		if c.L2 != "" && c.L2 != L2Host {
			return bad("--l2 %s needs --device %s (host runs keep L2 in host shared memory)", c.L2, DeviceCUDA)
		}
		c.L2 = L2Host
		return nil
	case DeviceCUDA:
	default:
		return bad("device %q (want %s or %s)", c.Device, DeviceHost, DeviceCUDA)
	}
	switch c.L2 {
	case "":
		c.L2 = L2Device
	case L2Device, L2Host:
	default:
		return bad("--l2 %q (want %s or %s)", c.L2, L2Device, L2Host)
	}
	if c.CUDADevice < -1 {
		return bad("--cuda-device %d (want a device ordinal, or -1 for LOCAL_RANK mod the device count)", c.CUDADevice)
	}
	if c.Storage != "" && c.L2 == L2Device {
		return bad("--storage %s needs L2 pages in host memory: use --l2 %s with --device %s", redact.URL(c.Storage), L2Host, DeviceCUDA)
	}
	return nil
}

// SelectDevice is the CUDA device a rank uses: explicit when it is an ordinal (>= 0), else
// its local rank mod the device count, so that the ranks of a node spread over its GPUs.
func SelectDevice(explicit, localRank, count int) (int, error) {
	if count <= 0 {
		return 0, fmt.Errorf("runner: --device cuda: no CUDA device (the driver reports %d)", count)
	}
	if explicit < 0 {
		return localRank % count, nil
	}
	if explicit >= count {
		return 0, bad("--cuda-device %d, but this node has %d CUDA device(s)", explicit, count)
	}
	return explicit, nil
}

// memory is where one rank's L1 and L2 live and how pages move between them. For host
// runs it holds nothing: the cache makes its HostEngine over host slabs. For CUDA runs it
// holds the device and the L1 pool in device memory that job.Open made, and a pinned
// staging page (jobConfig's OnDevice) through which the scheduler writes computed KV and
// reads loaded KV back; job.Open's Rank owns and closes them.
type memory struct {
	cfg     *Config
	dev     *cuda.Device
	name    string
	l1      cuda.DevicePtr
	staging *cuda.HostBuffer
	timed   *timedEngine
	kvL1    *kvmem.L1 // the per-layer L1 (with --model): a host run's, lent to the cache's engine, or job.Open's on the device
}

// jobMemory sets the memory kinds of jc from the run's: host runs leave the L1 to the cache
// and the L2 in host shared memory; CUDA runs put the L1 in device memory (a pool job.Open
// allocates on the device SelectDevice picks for localRank) and the L2 in CUDA IPC device
// slabs or pinned host slabs, with m's staging page and timed engine.
func (m *memory) jobMemory(jc *job.Config, localRank int) {
	if m.cfg.Device != DeviceCUDA {
		return
	}
	jc.L1, jc.L2 = job.L1Device, job.L2Pinned
	if m.cfg.L2 == L2Device {
		jc.L2 = job.L2Device
	}
	jc.PickDevice = func(n int) (int, error) { return SelectDevice(m.cfg.CUDADevice, localRank, n) }
	jc.OnDevice = func(dev *cuda.Device) (func() error, error) {
		var err error
		if m.staging, err = dev.AllocHost(m.cfg.PageBytes()); err != nil {
			return nil, err
		}
		return m.staging.Close, nil
	}
	jc.WrapEngine = func(e hicache.Engine) hicache.Engine {
		m.timed = newTimedEngine(e, m.cfg.PageBytes())
		return m.timed
	}
}

// opened takes the device and L1 pool of rk.
func (m *memory) opened(rk *job.Rank) {
	m.dev, m.name, m.l1 = rk.Device, rk.DeviceName, rk.L1Device
	if m.dev != nil && rk.KVL1 != nil {
		m.kvL1 = rk.KVL1 // job.Open's per-layer device buffers
	}
}

// layeredKV is how the scheduler reaches a per-layer L1 (nil without one): host buffers
// directly, device buffers through the staging page.
func (m *memory) layeredKV() sched.LayeredKV {
	switch {
	case m.kvL1 == nil:
		return nil
	case m.kvL1.Device():
		return deviceLayeredKV{m: m, l1: m.kvL1}
	}
	return layeredKV{m.kvL1}
}

// deviceKV is how the scheduler reaches a device L1's pages; nil with a host L1, whose pages
// the scheduler reaches through the cache by default.
func (m *memory) deviceKV() sched.KV {
	if m.dev == nil {
		return nil
	}
	return &deviceKV{m: m}
}

// corrupter returns the EnvCorruptRank hook: it flips a byte of one page of this rank's
// slab, once, through the host mapping or the device.
func (m *memory) corrupter(p *Plan, set *slab.Set, cpRank int) func(hicache.NodeInfo) {
	done := false
	return func(n hicache.NodeInfo) {
		for _, pg := range n.L2 {
			if done || pg.Slab != cpRank {
				continue
			}
			if m.kvL1 != nil && m.dev == nil { // a host run's per-layer L1: the page's own bytes in either L2 layout
				done = p.damageL2Page(set, pg) == nil
				continue
			}
			done = m.flipByte(set, pg) == nil
		}
	}
}

func (m *memory) flipByte(set *slab.Set, pg slab.Page) error {
	if b, err := set.Page(pg); err == nil {
		b[len(b)/2] ^= 0x5a
		return nil
	}
	if m.dev == nil {
		return errors.New("runner: no way to reach the page")
	}
	p, err := set.DevicePtr(pg)
	if err != nil {
		return err
	}
	at := cuda.DevicePtr(p).Add(set.PageSize() / 2)
	one := m.staging.Bytes()[:1]
	if err := m.dev.CopyDtoH(one, at); err != nil {
		return err
	}
	one[0] ^= 0x5a
	return m.dev.CopyHtoD(at, one)
}

// deviceKV is L1 in device memory, reached through the pinned staging page with
// synchronous copies (from pinned memory they are complete when they return, so a backup
// started later reads the new KV; a load's WaitL1 came before the read).
type deviceKV struct{ m *memory }

func (d *deviceKV) slot(slot int32) (cuda.DevicePtr, error) {
	if slot < 0 || int(slot) >= d.m.cfg.L1Pages {
		return 0, fmt.Errorf("runner: L1 slot %d outside a pool of %d pages", slot, d.m.cfg.L1Pages)
	}
	return d.m.l1.Add(int(slot) * d.m.cfg.PageBytes()), nil
}

func (d *deviceKV) Fill(slot int32, write func([]byte)) error {
	p, err := d.slot(slot)
	if err != nil {
		return err
	}
	b := d.m.staging.Bytes()
	write(b)
	return d.m.dev.CopyHtoD(p, b)
}

func (d *deviceKV) Read(slot int32) ([]byte, error) {
	p, err := d.slot(slot)
	if err != nil {
		return nil, err
	}
	b := d.m.staging.Bytes()
	return b, d.m.dev.CopyDtoH(b, p)
}

// deviceResult is what a CUDA rank reports about its memory and copies.
type deviceResult struct {
	Ordinal      int     `json:"ordinal"`
	Name         string  `json:"name"`
	L2           string  `json:"l2"` // L2Device or L2Host
	Batched      bool    `json:"batched"`
	WriteBytes   int64   `json:"write_bytes"` // L1 → L2
	WriteSeconds float64 `json:"write_seconds"`
	LoadBytes    int64   `json:"load_bytes"` // L2 → L1
	LoadSeconds  float64 `json:"load_seconds"`
}

// result is this rank's deviceResult (nil for host runs).
func (m *memory) result() *deviceResult {
	if m.dev == nil {
		return nil
	}
	r := &deviceResult{Ordinal: m.dev.Ordinal(), Name: m.name, L2: m.cfg.L2}
	if m.timed != nil {
		if ce, ok := m.timed.inner.(*cudaengine.Engine); ok {
			r.Batched = ce.Batched()
		}
		w, l := m.timed.busy()
		r.WriteBytes, r.WriteSeconds = w.bytes, w.busy.Seconds()
		r.LoadBytes, r.LoadSeconds = l.bytes, l.busy.Seconds()
	}
	return r
}

// largeCopyGBps measures the bandwidth of one large copy each way between an L1-kind
// buffer (device memory) and an L2-kind buffer (device memory, or pinned host memory): the
// baseline the page copies are compared with. Best of three; 64 MiB or the L1 pool's size
// when smaller.
func (m *memory) largeCopyGBps() (write, load float64, err error) {
	n := min(64<<20, m.cfg.L1Pages*m.cfg.PageBytes())
	a, err := m.dev.Alloc(n)
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	var b cuda.DevicePtr
	if m.cfg.L2 == L2Device {
		buf, err := m.dev.Alloc(n)
		if err != nil {
			return 0, 0, err
		}
		defer buf.Close()
		b = buf.Ptr()
	} else {
		buf, err := m.dev.AllocHost(n)
		if err != nil {
			return 0, 0, err
		}
		defer buf.Close()
		b = buf.DevicePtr()
	}
	s, err := m.dev.NewStream()
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	best := func(dst, src cuda.DevicePtr) (float64, error) { return s.CopyBandwidth(dst, src, n, 3) }
	if write, err = best(b, a.Ptr()); err != nil {
		return 0, 0, err
	}
	load, err = best(a.Ptr(), b)
	return write, load, err
}

func gbps(bytes int64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return float64(bytes) / seconds / 1e9
}
