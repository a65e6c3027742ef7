package slab

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/shmseg"
)

// SegmentPrefix starts the name of every host segment this package creates:
// SegmentPrefix + tag + "-r" + rank. The segments are anonymous (memfd): the name shows only
// in /proc/PID/fd links of the processes that hold one, never in /dev/shm.
const SegmentPrefix = "cpcache-slab-"

// hostRegion is a mapped host shared-memory segment.
type hostRegion struct {
	handle string          // the segment's handle (for errors)
	seg    *shmseg.Segment // this rank's own segment while it is offered to peers; nil for a peer's
	mem    []byte          // the mapping; nil after close
}

// segmentName is the name of rank's segment.
func segmentName(spec Spec, rank int) string {
	tag := spec.Tag
	if tag != "" {
		tag += "-"
	}
	return fmt.Sprintf("%s%sr%d", SegmentPrefix, tag, rank)
}

// createHost creates, sizes, maps and offers a new anonymous segment for rank's slab.
func createHost(spec Spec, rank int) (*hostRegion, error) {
	seg, err := shmseg.Create(segmentName(spec, rank), spec.Bytes(), true)
	if err != nil {
		return nil, fmt.Errorf("slab: %w", err)
	}
	return &hostRegion{handle: seg.Handle, seg: seg, mem: seg.Mem}, nil
}

// openHost maps a peer's segment after checking that its handle is one of this package's;
// shmseg.Map checks that the peer runs as this user and that the segment has the agreed size.
func openHost(ctx context.Context, spec Spec, handle string) (*hostRegion, error) {
	if !shmseg.IsHandle(handle, SegmentPrefix) {
		return nil, fmt.Errorf("slab: segment handle %q is not a %s* segment", handle, SegmentPrefix)
	}
	mem, err := shmseg.Map(ctx, handle, spec.Bytes())
	if err != nil {
		return nil, fmt.Errorf("slab: %w", err)
	}
	return &hostRegion{handle: handle, mem: mem}, nil
}

// unshare stops offering this rank's own segment to peers; the mappings stay valid. It is
// nil-safe and idempotent.
func (h *hostRegion) unshare() error {
	if h == nil || h.seg == nil {
		return nil
	}
	if err := h.seg.Unshare(); err != nil {
		return fmt.Errorf("slab: %w", err)
	}
	return nil
}

// close stops offering and unmaps the region; it is idempotent.
func (h *hostRegion) close() error {
	if h == nil || h.mem == nil {
		return nil
	}
	uerr := h.unshare()
	err := unix.Munmap(h.mem)
	h.mem = nil
	if err != nil {
		return fmt.Errorf("slab: unmap segment %s: %w", h.handle, err)
	}
	return uerr
}
