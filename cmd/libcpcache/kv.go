package main

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/parallel"
)

// Memory kinds of an L1 buffer (CPCACHE_MEM_* in include/cpcache.h).
const (
	memHost   = 1
	memDevice = 2
)

// kvPartDesc is one cpcache_kv_part as the caller gave it.
type kvPartDesc struct {
	name          string
	bytesPerToken int64
	sharding      int32
	reserved      int32
}

// l1BufferDesc is one cpcache_l1_buffer as the caller gave it.
type l1BufferDesc struct {
	layer, part, kind int32
	tokenBytes        int32          // cpcache_l1_buffer.token_bytes: the row's bytes a token, 0 not known
	base              unsafe.Pointer // memory outside the Go heap, the caller's
	bytes, pageStride int64
	tokenStride       int64
}

// kvConfig is the ABI-2 part of cpcache_config (the KV layout, the engine's L1 buffers, the
// L2 layout) as given, and what resolveKV makes of it.
type kvConfig struct {
	kvSpec     string // kv_layout: a preset name or kvlayout.Parse's text
	kvParts    []kvPartDesc
	kvLayers   int
	l1Buffers  []l1BufferDesc
	l2LayoutIn int  // l2_layout as given
	badCounts  bool // a negative kv_num_parts or l1_num_buffers, or a count with a NULL array

	// Set by resolveKV.
	kvLayout *kvlayout.Layout // nil: opaque pages
	kvBufs   []kvmem.Buffer
	device   bool // kvBufs are device memory (CPCACHE_MEM_DEVICE, with l1_kind CPCACHE_L1_DEVICE)
	l2Layout kvmem.L2Layout
	attnTP   int // 0: not known before the job's world is (world 0)
}

// attnTPOf is the attention-TP size of layout lc, or 0 when it is not known before open: the
// layout is invalid (parallel.NewLayout judges it later, alike on every rank) or its world is
// the launcher's and the environment does not say it (parallel.FromEnv fails, and the job
// fails with that cause). World 0 is the launcher's world size as the job reads it, so that
// the KV layout and the L1 buffers are checked here, before any rank talks to another, under
// a launcher's world as under an explicit one.
func attnTPOf(lc parallel.LayoutConfig) int {
	if lc.World == 0 {
		env, err := parallel.FromEnv()
		if err != nil {
			return 0
		}
		lc.World = env.WorldSize
	}
	if lc.World <= 0 {
		return 0
	}
	l, err := parallel.NewLayout(lc)
	if err != nil {
		return 0
	}
	return l.AttnTP
}

// resolveKV checks the KV layout, the L1 buffers and the L2 layout of c and fills in what
// they determine (kvLayout, kvBufs, l2Layout; page_bytes 0 becomes this rank's bytes of a
// page), before any rank talks to another. Errors wrap errInvalid and name the bad field,
// part, or buffer's layer and part. c.pageTokens must be positive.
func resolveKV(c *openConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errInvalid}, args...)...)
	}
	k := &c.kv
	k.kvLayout, k.kvBufs, k.l2Layout, k.device = nil, nil, 0, false
	switch {
	case k.badCounts:
		return bad("kv_num_parts and l1_num_buffers must be 0 or the length of a non-NULL kv_parts, l1_buffers")
	case k.kvSpec != "" && len(k.kvParts) > 0:
		return bad("kv_layout %q and kv_parts (%d parts) are both set: give one", k.kvSpec, len(k.kvParts))
	case k.l2LayoutIn != 0 && !kvmem.L2Layout(k.l2LayoutIn).Valid() || k.l2LayoutIn < 0 || k.l2LayoutIn > math.MaxUint8:
		return bad("l2_layout %d (want 0, CPCACHE_L2_PAGE_FIRST or CPCACHE_L2_LAYER_FIRST)", k.l2LayoutIn)
	}
	k.l2Layout = kvmem.L2Layout(k.l2LayoutIn)
	switch {
	case k.kvSpec != "":
		l, err := kvlayout.Parse(k.kvSpec)
		if err != nil {
			return bad("kv_layout %q: %w", k.kvSpec, err)
		}
		k.kvLayout = &l
	case len(k.kvParts) > 0:
		l := kvlayout.Layout{NumLayers: k.kvLayers}
		for i, p := range k.kvParts {
			switch {
			case p.reserved != 0:
				return bad("kv_parts[%d] (%q): reserved is %d, want 0", i, p.name, p.reserved)
			case p.bytesPerToken <= 0 || p.bytesPerToken > math.MaxInt32:
				return bad("kv_parts[%d] (%q): bytes_per_token %d must be in 1..2^31-1", i, p.name, p.bytesPerToken)
			case p.sharding != int32(kvlayout.Sharded) && p.sharding != int32(kvlayout.Replicated):
				return bad("kv_parts[%d] (%q): sharding %d (want CPCACHE_KV_SHARDED or CPCACHE_KV_REPLICATED)", i, p.name, p.sharding)
			}
			l.Parts = append(l.Parts, kvlayout.Part{Name: p.name, BytesPerToken: int(p.bytesPerToken), Sharding: kvlayout.Sharding(p.sharding)})
		}
		if err := l.Validate(); err != nil {
			return bad("kv_parts: %w", err)
		}
		k.kvLayout = &l
	case k.kvLayers != 0:
		return bad("kv_num_layers %d without kv_parts", k.kvLayers)
	}
	if k.kvLayout == nil {
		switch {
		case len(k.l1Buffers) > 0:
			return bad("l1_buffers (%d) need a KV layout (kv_layout or kv_parts)", len(k.l1Buffers))
		case k.l2Layout == kvmem.LayerFirst:
			return bad("l2_layout layer_first needs a KV layout (kv_layout or kv_parts)")
		}
		return nil
	}
	k.attnTP = attnTPOf(c.layout)
	if k.attnTP > 0 {
		pb, err := k.kvLayout.PageBytes(c.pageTokens, k.attnTP)
		if err != nil {
			return bad("KV layout at attention-TP %d, %d tokens a page: %w", k.attnTP, c.pageTokens, err)
		}
		switch {
		case c.pageBytes == 0 && pb <= math.MaxInt32:
			c.pageBytes = int(pb)
		case int64(c.pageBytes) != pb:
			return bad("page_bytes %d, but the KV layout %s takes %d bytes a page on each of %d attention-TP ranks at %d tokens a page (set page_bytes 0 to take it)",
				c.pageBytes, k.kvLayout, pb, k.attnTP, c.pageTokens)
		}
	} else if c.pageBytes == 0 {
		return bad("page_bytes 0 with a KV layout needs the attention-TP size, which divides the sharded parts, before open: give page_bytes, or a valid layout (an explicit world, or a launcher's in the environment)")
	}
	if len(k.l1Buffers) == 0 {
		return nil
	}
	first := k.l1Buffers[0]
	for i, b := range k.l1Buffers {
		where := fmt.Sprintf("l1_buffers[%d] (layer %d, part %d)", i, b.layer, b.part)
		switch {
		case b.tokenBytes < 0:
			return bad("%s: token_bytes %d is negative (0: not known)", where, b.tokenBytes)
		case b.kind != memHost && b.kind != memDevice:
			return bad("%s: kind %d (want CPCACHE_MEM_HOST or CPCACHE_MEM_DEVICE)", where, b.kind)
		case b.kind != first.kind:
			return bad("%s: %s, but l1_buffers[0] (layer %d, part %d) is %s: give buffers of one kind",
				where, memKindName(b.kind), first.layer, first.part, memKindName(first.kind))
		case b.base == nil:
			return bad("%s: base is NULL", where)
		case b.bytes <= 0:
			return bad("%s: bytes %d must be positive", where, b.bytes)
		}
		buf := kvmem.Buffer{Layer: int(b.layer), Part: int(b.part), Bytes: b.bytes, PageStride: b.pageStride, TokenStride: b.tokenStride,
			TokenBytes: int64(b.tokenBytes)}
		if b.kind == memDevice {
			buf.Device = uintptr(b.base) // the engine's device memory: only the CUDA engine addresses it
		} else {
			buf.Host = unsafe.Slice((*byte)(b.base), b.bytes)
		}
		k.kvBufs = append(k.kvBufs, buf)
	}
	k.device = first.kind == memDevice
	where := fmt.Sprintf("l1_buffers[0] (layer %d, part %d)", first.layer, first.part)
	switch {
	case !k.device && (c.l1Kind != l1Alloc || c.l1Base != nil):
		return bad("l1_buffers replace the L1 pool: with host buffers (%s is CPCACHE_MEM_HOST) l1_kind must be CPCACHE_L1_ALLOC and l1_base NULL (got l1_kind %d)", where, c.l1Kind)
	case k.device && (c.l1Kind != l1Device || c.l1Base != nil):
		return bad("%s: device buffers (CPCACHE_MEM_DEVICE) need l1_kind CPCACHE_L1_DEVICE and l1_base NULL (got l1_kind %d): they replace the device L1 pool", where, c.l1Kind)
	}
	if k.attnTP > 0 {
		// The whole description (every (layer, part) once, sizes, strides, overlaps), here,
		// before open; where the layout is not known yet the job checks it once it is.
		shape, err := kvmem.NewShape(*k.kvLayout, k.attnTP, c.pageTokens)
		if err != nil {
			return bad("KV layout: %w", err)
		}
		if _, err := kvmem.NewL1(shape, c.l1Pages, k.kvBufs); err != nil {
			return bad("%s", l1BufferError(k.l1Buffers, err))
		}
	}
	return nil
}

// l1BufferError is kvmem.NewL1's error err about bufs in the ABI's terms: the buffer by its
// index in l1_buffers, its layer and part ("l1_buffers[3]: layer 1 part 1 ("v"): ..."), or
// the layer and part when no buffer describes them.
func l1BufferError(bufs []l1BufferDesc, err error) string {
	var e *kvmem.Error
	if !errors.As(err, &e) || e.Layer < 0 || e.Part < 0 {
		return "l1_buffers: " + err.Error()
	}
	for i, b := range bufs {
		if int(b.layer) == e.Layer && int(b.part) == e.Part {
			return fmt.Sprintf("l1_buffers[%d]: layer %d part %d (%q): %s", i, e.Layer, e.Part, e.PartName, e.Reason)
		}
	}
	return fmt.Sprintf("l1_buffers: layer %d part %d (%q): %s", e.Layer, e.Part, e.PartName, e.Reason)
}

// memKindName is a cpcache_l1_buffer kind's macro name.
func memKindName(kind int32) string {
	if kind == memDevice {
		return "CPCACHE_MEM_DEVICE"
	}
	return "CPCACHE_MEM_HOST"
}

// kvSizes is this rank's KV bytes per token and per page under c's layout at attention-TP
// attnTP (ok false without a layout).
func kvSizes(c *openConfig, attnTP int) (perToken, perPage int64, ok bool) {
	if c.kv.kvLayout == nil {
		return 0, 0, false
	}
	bpt, err := c.kv.kvLayout.BytesPerToken(attnTP)
	if err != nil {
		return 0, 0, false
	}
	return bpt, bpt * int64(c.pageTokens), true
}
