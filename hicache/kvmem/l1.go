package kvmem

import (
	"fmt"
	"math"
	"unsafe"
)

// Buffer is one (layer, part) buffer of the engine's L1, lent by the engine: where slot s's
// token k of that part lives is base + s×PageStride + k×TokenStride, for PartBytesPerToken
// bytes.
type Buffer struct {
	Layer, Part int
	Host        []byte  // host memory, or nil
	Device      uintptr // device address, or 0 (exactly one of Host/Device)
	Bytes       int64   // size (0 with Host: len(Host))
	PageStride  int64   // bytes from page slot s to s+1 (token-slot buffers: P × TokenStride; vLLM block-major: the block stride)
	TokenStride int64   // bytes from token k to k+1 of a page (>= the part's bytes per token on this rank)
	// TokenBytes is the row the engine's array holds for one token (its non-token
	// dimensions × element size), 0 when not known. When set it must equal the part's bytes
	// per token on this rank: a row wider than the part would be half cached (a padded row
	// is declared by leaving it 0), a narrower one would spill into the next row.
	TokenBytes int64
}

// L1 is an engine's KV memory as per-(layer, part) buffers of `slots` page slots each.
type L1 struct {
	shape  *Shape
	slots  int
	device bool
	bufs   []Buffer // by layer×Parts + part
}

// NewL1 checks bufs against shape and returns the L1 they describe: every (layer, part) of
// shape exactly once, all host or all device memory, TokenStride >= the part's bytes per
// token, a page's P tokens within PageStride, each buffer big enough for `slots` slots, and
// no two buffers overlapping, and a TokenBytes that is set equal to the part's bytes per
// token. The overlap check is stride-aware: two buffers whose extents overlap are accepted
// only when they have the same PageStride and either each slot's token span (first token to
// the end of the last) of one lies outside the other's (vLLM's K and V of one block-major
// tensor), or they also have the same TokenStride, dividing PageStride, and their byte ranges
// within a token's row are disjoint (K and V interleaved per token: disjoint columns of one
// [tokens, 2 × row] array), so that they share no byte. Errors are *Error wrapping ErrBadL1,
// naming the layer and part.
func NewL1(shape *Shape, slots int, bufs []Buffer) (*L1, error) {
	if shape == nil {
		return nil, &Error{Layer: -1, Part: -1, Reason: "no shape"}
	}
	if slots <= 0 || slots > math.MaxInt32 {
		return nil, &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("slot count %d out of [1, %d]", slots, math.MaxInt32)}
	}
	if len(bufs) == 0 {
		return nil, &Error{Layer: -1, Part: -1, Reason: "no buffers"}
	}
	l := &L1{shape: shape, slots: slots, device: bufs[0].Host == nil, bufs: make([]Buffer, shape.Chunks())}
	seen := make([]bool, shape.Chunks())
	for _, b := range bufs {
		if err := shape.checkChunk(b.Layer, b.Part); err != nil {
			return nil, err
		}
		bad := func(format string, args ...any) error {
			return &Error{Layer: b.Layer, Part: b.Part, PartName: shape.PartName(b.Part), Reason: fmt.Sprintf(format, args...)}
		}
		i := b.Layer*shape.Parts() + b.Part
		if seen[i] {
			return nil, bad("described twice")
		}
		seen[i] = true
		switch {
		case b.Host == nil && b.Device == 0:
			return nil, bad("neither host nor device memory")
		case b.Host != nil && b.Device != 0:
			return nil, bad("both host and device memory")
		case (b.Host == nil) != l.device:
			return nil, bad("host and device buffers mixed in one L1 (layer %d part %d is the other kind)", bufs[0].Layer, bufs[0].Part)
		}
		if b.Host != nil {
			if b.Bytes == 0 {
				b.Bytes = int64(len(b.Host))
			} else if b.Bytes != int64(len(b.Host)) {
				return nil, bad("Bytes %d but a host slice of %d", b.Bytes, len(b.Host))
			}
		}
		bpt := int64(shape.PartBytesPerToken(b.Part))
		if b.TokenBytes < 0 {
			return nil, bad("token bytes %d is negative (0: not known)", b.TokenBytes)
		}
		if b.TokenBytes != 0 && b.TokenBytes != bpt {
			return nil, bad("the buffer's rows are %d bytes a token, the part's bytes per token on this rank are %d", b.TokenBytes, bpt)
		}
		if b.TokenStride < bpt {
			return nil, bad("token stride %d below the part's %d bytes per token", b.TokenStride, bpt)
		}
		span := b.tokenSpan(shape)
		if span < 0 || b.PageStride < span {
			return nil, bad("page stride %d below a page's %d tokens × stride %d + %d bytes", b.PageStride, shape.PageTokens(), b.TokenStride, bpt)
		}
		if b.PageStride > (math.MaxInt64-span)/int64(slots) {
			return nil, bad("page stride %d × %d slots overflows", b.PageStride, slots)
		}
		if need := b.extent(shape, slots); b.Bytes < need {
			return nil, bad("%d bytes, %d slots need %d", b.Bytes, slots, need)
		}
		l.bufs[i] = b
	}
	for i, ok := range seen {
		if !ok {
			layer, part := i/shape.Parts(), i%shape.Parts()
			return nil, &Error{Layer: layer, Part: part, PartName: shape.PartName(part), Reason: "no buffer"}
		}
	}
	if err := l.checkOverlaps(); err != nil {
		return nil, err
	}
	return l, nil
}

// tokenSpan is the bytes from a slot's first token to the end of its last.
func (b *Buffer) tokenSpan(s *Shape) int64 {
	p := int64(s.PageTokens())
	if b.TokenStride > (math.MaxInt64-int64(s.PartBytesPerToken(b.Part)))/p {
		return -1
	}
	return (p-1)*b.TokenStride + int64(s.PartBytesPerToken(b.Part))
}

// extent is the bytes from the buffer's base to the end of slot slots-1's last token.
func (b *Buffer) extent(s *Shape, slots int) int64 {
	return int64(slots-1)*b.PageStride + b.tokenSpan(s)
}

func (b *Buffer) base() uintptr {
	if b.Host != nil {
		return uintptr(unsafe.Pointer(unsafe.SliceData(b.Host)))
	}
	return b.Device
}

func (l *L1) checkOverlaps() error {
	for i := range l.bufs {
		a := &l.bufs[i]
		ab, ae := uint64(a.base()), uint64(a.base())+uint64(a.extent(l.shape, l.slots))
		for j := i + 1; j < len(l.bufs); j++ {
			b := &l.bufs[j]
			bb, be := uint64(b.base()), uint64(b.base())+uint64(b.extent(l.shape, l.slots))
			if ae <= bb || be <= ab {
				continue
			}
			if a.PageStride == b.PageStride && (spansDisjoint(a, b, l.shape) || columnsDisjoint(a, b, l.shape)) {
				continue
			}
			return &Error{Layer: b.Layer, Part: b.Part, PartName: l.shape.PartName(b.Part),
				Reason: fmt.Sprintf("overlaps the buffer of layer %d part %d (%q)", a.Layer, a.Part, l.shape.PartName(a.Part))}
		}
	}
	return nil
}

// spansDisjoint reports whether two buffers of one page stride keep each slot's token spans
// apart: modulo the stride, [0, spanA) and [d, d+spanB) do not meet, d = baseB - baseA.
func spansDisjoint(a, b *Buffer, s *Shape) bool {
	ps := uint64(a.PageStride)
	var d uint64 // baseB - baseA modulo ps
	if b.base() >= a.base() {
		d = (uint64(b.base()) - uint64(a.base())) % ps
	} else {
		d = (ps - (uint64(a.base())-uint64(b.base()))%ps) % ps
	}
	sa, sb := uint64(a.tokenSpan(s)), uint64(b.tokenSpan(s))
	// B's span starts at d within A's period: it must start at or after A's end and end (mod
	// ps) at or before A's next start.
	return d >= sa && d+sb <= ps
}

// columnsDisjoint reports whether two buffers of one page stride and one token stride ts,
// which divides the page stride, keep their bytes of a token apart: every byte of either lies
// on the lattice of period ts, A's at offsets [0, bptA) of it and B's at [d, d+bptB) modulo ts,
// d = baseB - baseA; when those ranges do not meet, the buffers share no byte.
func columnsDisjoint(a, b *Buffer, s *Shape) bool {
	ts := uint64(a.TokenStride)
	if a.TokenStride != b.TokenStride || ts == 0 || uint64(a.PageStride)%ts != 0 {
		return false
	}
	var d uint64 // baseB - baseA modulo ts
	if b.base() >= a.base() {
		d = (uint64(b.base()) - uint64(a.base())) % ts
	} else {
		d = (ts - (uint64(a.base())-uint64(b.base()))%ts) % ts
	}
	ba, bb := uint64(s.PartBytesPerToken(a.Part)), uint64(s.PartBytesPerToken(b.Part))
	return d >= ba && d+bb <= ts
}

// Shape is the page shape the L1 holds.
func (l *L1) Shape() *Shape { return l.shape }

// Slots is the number of page slots of every buffer.
func (l *L1) Slots() int { return l.slots }

// Device reports whether the buffers are device memory (else host).
func (l *L1) Device() bool { return l.device }

// Buffer returns the buffer of (layer, part) (Bytes filled in for host buffers).
func (l *L1) Buffer(layer, part int) Buffer { return l.bufs[layer*l.shape.Parts()+part] }

// Contiguous reports whether a slot's chunk of (layer, part) is one run of ChunkBytes bytes
// (TokenStride == the part's bytes per token): one copy per chunk.
func (l *L1) Contiguous(layer, part int) bool {
	return l.bufs[layer*l.shape.Parts()+part].TokenStride == int64(l.shape.PartBytesPerToken(part))
}

// ChunkOffset is the offset of slot's chunk of (layer, part) from its buffer's base (token 0;
// token k is TokenStride×k further). The error (wrapping ErrBadL1) names an out-of-range slot,
// layer or part.
func (l *L1) ChunkOffset(slot int32, layer, part int) (int64, error) {
	if err := l.shape.checkChunk(layer, part); err != nil {
		return 0, err
	}
	if slot < 0 || int(slot) >= l.slots {
		return 0, &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L1 slot %d out of [0, %d)", slot, l.slots)}
	}
	return int64(slot) * l.bufs[layer*l.shape.Parts()+part].PageStride, nil
}

// ChunkAddr is the device address of slot's chunk of (layer, part) (device L1s; for host
// L1s the address of the host memory, valid while the engine keeps it).
func (l *L1) ChunkAddr(slot int32, layer, part int) (uintptr, error) {
	off, err := l.ChunkOffset(slot, layer, part)
	if err != nil {
		return 0, err
	}
	b := &l.bufs[layer*l.shape.Parts()+part]
	return b.base() + uintptr(off), nil
}

// HostChunk returns slot's bytes of (layer, part) of a host L1, from token 0 to the end of
// token P-1 (ChunkBytes long when Contiguous; else the tokens are TokenStride apart).
func (l *L1) HostChunk(slot int32, layer, part int) ([]byte, error) {
	if l.device {
		return nil, &Error{Layer: layer, Part: part, Reason: "device memory has no host bytes"}
	}
	off, err := l.ChunkOffset(slot, layer, part)
	if err != nil {
		return nil, err
	}
	b := &l.bufs[layer*l.shape.Parts()+part]
	end := off + b.tokenSpan(l.shape)
	return b.Host[off:end:end], nil
}
