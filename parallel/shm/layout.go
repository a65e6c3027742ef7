package shm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Segment layout. Every shared word is accessed with sync/atomic through a pointer into the
// mapping; slot contents are plain memory published by the atomic arrival store that
// follows them and read after the atomic load that observes every arrival.
//
//	0    header: magic u64, version u32, size u32, slotBytes u32, nonce [16]byte
//	64   bell u32 (futex word, bumped when a round completes or fails), waiters u32
//	128  arrivals u64 (total arrivals since creation: round g is complete at (g+1)*size)
//	192  abort u64 (0, or the encoded reason the group failed; first writer wins)
//	256  control blocks, ctlStride bytes per member: arrive u64 (rounds this member
//	     arrived at), closed u32, pid u32
//	...  slots: 2 buffers x size members, slotStride bytes each: slot header (kind u32,
//	     arg u32, n u32, pad u32, length u64) then SlotBytes of data
const (
	magic         = 0x31304d4853435043 // "CPCSHM01" little-endian
	layoutVersion = 1

	offMagic     = 0
	offVersion   = 8
	offSize      = 12
	offSlotBytes = 16
	offNonce     = 24
	nonceLen     = 16
	offBell      = 64
	offWaiters   = 68
	offArrivals  = 128
	offAbort     = 192
	offCtl       = 256

	ctlStride    = 128
	ctlArrive    = 0
	ctlClosed    = 8
	ctlPid       = 12
	slotHdrBytes = 64
	slotKind     = 0
	slotArg      = 4
	slotN        = 8
	slotLen      = 16
	lineBytes    = 128
)

// layout locates every field of a segment for a group of size members.
type layout struct {
	size, slotBytes int
	slotStride      int
	slotsOff        int
	total           int
}

func newLayout(size, slotBytes int) layout {
	l := layout{size: size, slotBytes: slotBytes}
	l.slotStride = roundUp(slotHdrBytes+slotBytes, lineBytes)
	l.slotsOff = roundUp(offCtl+size*ctlStride, lineBytes)
	l.total = roundUp(l.slotsOff+2*size*l.slotStride, 4096)
	return l
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

func (l layout) ctl(r int) int { return offCtl + r*ctlStride }

// slot is the offset of member r's slot in buffer parity p (0 or 1).
func (l layout) slot(p, r int) int { return l.slotsOff + (p*l.size+r)*l.slotStride }

// writeHeader initialises a fresh (zeroed) segment.
func (l layout) writeHeader(mem []byte, nonce []byte) {
	binary.LittleEndian.PutUint32(mem[offVersion:], layoutVersion)
	binary.LittleEndian.PutUint32(mem[offSize:], uint32(l.size))
	binary.LittleEndian.PutUint32(mem[offSlotBytes:], uint32(l.slotBytes))
	copy(mem[offNonce:offNonce+nonceLen], nonce)
	// The magic goes last: a segment with the magic is fully initialised.
	atomic.StoreUint64(u64(mem, offMagic), magic)
}

// checkHeader verifies that mem is a segment made for this group by its creator.
func (l layout) checkHeader(mem []byte, nonce []byte) error {
	if len(mem) < offCtl {
		return fmt.Errorf("segment is %d bytes, too small for a header", len(mem))
	}
	if m := atomic.LoadUint64(u64(mem, offMagic)); m != magic {
		return fmt.Errorf("segment magic %#x, want %#x", m, uint64(magic))
	}
	if v := binary.LittleEndian.Uint32(mem[offVersion:]); v != layoutVersion {
		return fmt.Errorf("segment layout version %d, want %d", v, layoutVersion)
	}
	if s := int(binary.LittleEndian.Uint32(mem[offSize:])); s != l.size {
		return fmt.Errorf("segment made for %d members, group has %d", s, l.size)
	}
	if sb := int(binary.LittleEndian.Uint32(mem[offSlotBytes:])); sb != l.slotBytes {
		return fmt.Errorf("segment has SlotBytes %d, this member uses %d (options differ across members)", sb, l.slotBytes)
	}
	if !bytes.Equal(mem[offNonce:offNonce+nonceLen], nonce) {
		return fmt.Errorf("segment nonce %x does not match its name's %x", mem[offNonce:offNonce+nonceLen], nonce)
	}
	if len(mem) < l.total {
		return fmt.Errorf("segment is %d bytes, want %d", len(mem), l.total)
	}
	return nil
}

func u64(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }
func u32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
