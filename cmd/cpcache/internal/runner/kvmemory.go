package runner

import (
	"fmt"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/slab"
)

// L2 layouts (--l2-layout) and L1 buffer kinds (--l1-buffers).
const (
	L2PageFirst  = "page_first"  // a page holds every layer (the storage value; the default)
	L2LayerFirst = "layer_first" // a slab holds, per layer, that layer of all its pages
	L1TokenSlot  = "token_slot"  // per layer and part a buffer indexed by token slot (SGLang; the default)
	L1BlockMajor = "block_major" // per layer one tensor [blocks, parts, P, bytes] (vLLM)
)

// checkKVMemory validates --l2-layout and --l1-buffers (Prepare calls it after checkDevice)
// and fills in their defaults: page_first, and with --model token_slot.
func (c *Config) checkKVMemory() error {
	switch c.L2Layout {
	case "":
		c.L2Layout = L2PageFirst
	case L2PageFirst, L2LayerFirst:
	default:
		return bad("--l2-layout %q (want %s or %s)", c.L2Layout, L2PageFirst, L2LayerFirst)
	}
	switch c.L1Buffers {
	case "", L1TokenSlot, L1BlockMajor:
	default:
		return bad("--l1-buffers %q (want %s or %s)", c.L1Buffers, L1TokenSlot, L1BlockMajor)
	}
	switch {
	case c.Model == "" && c.L2Layout == L2LayerFirst:
		return bad("--l2-layout %s needs --model (a page of opaque bytes has no layers)", c.L2Layout)
	case c.Model == "" && c.L1Buffers != "":
		return bad("--l1-buffers %s needs --model (a page of opaque bytes has no layers)", c.L1Buffers)
	case c.Device == DeviceCUDA && c.L1Buffers == L1BlockMajor:
		return bad("--l1-buffers %s needs --device %s (a CUDA run's per-layer L1 is token-slot buffers)", c.L1Buffers, DeviceHost)
	}
	if c.Model != "" && c.L1Buffers == "" {
		c.L1Buffers = L1TokenSlot
	}
	return nil
}

// layered reports whether the run's L1 is per-layer buffers (a run with --model): the
// scheduler fills and checks them chunk by chunk and waits for load-backs layer by layer.
func (c *Config) layered() bool { return c.L1Buffers != "" }

// l1Kind says what the run's L1 is, for the report.
func (c *Config) l1Kind() string {
	switch {
	case c.L1Buffers == L1TokenSlot && c.Device == DeviceCUDA:
		return "device, per layer and part a token-slot buffer"
	case c.L1Buffers == L1TokenSlot:
		return "host, per layer and part a token-slot buffer"
	case c.L1Buffers == L1BlockMajor:
		return "host, per layer a block-major tensor"
	case c.Device == DeviceCUDA:
		return "device, one pool of whole pages"
	}
	return "host, one pool of whole pages"
}

// l2Layout is --l2-layout as kvmem reads it.
func (c *Config) l2Layout() (kvmem.L2Layout, error) {
	l, err := kvmem.ParseL2Layout(c.L2Layout)
	if err != nil {
		return 0, bad("--l2-layout: %w", err)
	}
	return l, nil
}

// kvL1 allocates this rank's per-layer L1 (a host run with --model): L1Pages page slots of
// p's layout at the plan's attention-TP size, as --l1-buffers lays them out, on the Go heap.
func (p *Plan) kvL1() (*kvmem.L1, error) {
	c := &p.Config
	shape, err := kvmem.NewShape(*p.KVLayout, p.Layout.AttnTP, c.PageSize)
	if err != nil {
		return nil, bad("--model %s: %w", c.Model, err)
	}
	var bufs []kvmem.Buffer
	switch c.L1Buffers {
	case L1TokenSlot:
		bufs = kvmem.AllocTokenSlotBuffers(shape, c.L1Pages)
	case L1BlockMajor:
		bufs = kvmem.BlockMajorBuffers(shape, c.L1Pages, func(int) []byte { return make([]byte, int64(c.L1Pages)*shape.LayerBytes()) })
	default:
		return nil, fmt.Errorf("runner: --l1-buffers %q has no allocator", c.L1Buffers)
	}
	return kvmem.NewL1(shape, c.L1Pages, bufs)
}

// kvMemory sets jc's per-layer L1 and L2 layout: a layered host run's L1 is allocated here
// (and returned), a layered CUDA run's by job.Open on its device (job.Config.DeviceKVL1).
func (p *Plan) kvMemory(jc *job.Config) (*kvmem.L1, error) {
	lay, err := p.Config.l2Layout()
	if err != nil {
		return nil, err
	}
	jc.L2Layout = lay
	if !p.Config.layered() {
		return nil, nil
	}
	if p.Config.Device == DeviceCUDA {
		jc.DeviceKVL1 = true
		return nil, nil
	}
	l1, err := p.kvL1()
	if err != nil {
		return nil, err
	}
	jc.KVL1 = l1
	return l1, nil
}

// layeredKV is the scheduler's view of a host per-layer L1 (sched.LayeredKV): kvtest's
// layered content, written and checked chunk by chunk through the buffers' strides.
type layeredKV struct{ l1 *kvmem.L1 }

func (k layeredKV) Layers() int { return k.l1.Shape().Layers() }

func (k layeredKV) FillPage(slot int32, pageHash uint64, index, shard int) error {
	return kvtest.FillL1Page(k.l1, slot, pageHash, index, shard)
}

func (k layeredKV) CheckLayer(slot int32, layer int, pageHash uint64, index, shard int) error {
	return kvtest.CheckL1Layer(k.l1, slot, layer, pageHash, index, shard)
}

// damageL2Page flips one byte of L2 page pg's own bytes in its host slab (EnvCorruptRank and
// the tests' corrupt rank): the middle byte of its chunk (layer 0, part 0), wherever the L2
// layout puts it (a layer_first L2 spreads a page over its slab).
func (p *Plan) damageL2Page(hs engine.HostSlabMemory, pg slab.Page) error {
	lay, err := p.Config.l2Layout()
	if err != nil {
		return err
	}
	shape, err := kvmem.NewShape(*p.KVLayout, p.Layout.AttnTP, p.Config.PageSize)
	if err != nil {
		return err
	}
	mem, err := hs.SlabMemory(pg.Slab)
	if err != nil {
		return err
	}
	off, err := shape.L2ChunkOffset(lay, hs.PagesPerSlab(), pg.Index, 0, 0)
	if err != nil {
		return err
	}
	mem[off+shape.ChunkBytes(0)/2] ^= 0x5a
	return nil
}

// deviceLayeredKV is the scheduler's view of a device per-layer L1 (token-slot buffers: each
// chunk contiguous), reached chunk by chunk through the pinned staging page with synchronous
// copies (see deviceKV).
type deviceLayeredKV struct {
	m  *memory
	l1 *kvmem.L1
}

func (d deviceLayeredKV) Layers() int { return d.l1.Shape().Layers() }

// chunk is the device address of chunk (layer, part) of slot and a staging buffer its size.
func (d deviceLayeredKV) chunk(slot int32, layer, part int) (cuda.DevicePtr, []byte, error) {
	addr, err := d.l1.ChunkAddr(slot, layer, part)
	if err != nil {
		return 0, nil, err
	}
	if !d.l1.Contiguous(layer, part) {
		return 0, nil, fmt.Errorf("runner: device L1 chunk (layer %d, part %d) is strided; the run copies whole chunks", layer, part)
	}
	return cuda.DevicePtr(addr), d.m.staging.Bytes()[:d.l1.Shape().ChunkBytes(part)], nil
}

func (d deviceLayeredKV) FillPage(slot int32, pageHash uint64, index, shard int) error {
	for layer := range d.l1.Shape().Layers() {
		for part := range d.l1.Shape().Parts() {
			addr, b, err := d.chunk(slot, layer, part)
			if err != nil {
				return err
			}
			kvtest.FillChunk(b, pageHash, index, layer, part, shard)
			if err := d.m.dev.CopyHtoD(addr, b); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d deviceLayeredKV) CheckLayer(slot int32, layer int, pageHash uint64, index, shard int) error {
	for part := range d.l1.Shape().Parts() {
		addr, b, err := d.chunk(slot, layer, part)
		if err != nil {
			return err
		}
		if err := d.m.dev.CopyDtoH(b, addr); err != nil {
			return err
		}
		if err := kvtest.CheckChunk(b, d.l1.Shape(), pageHash, index, layer, part, shard); err != nil {
			return err
		}
	}
	return nil
}
