package slab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/shmseg"
)

// SegmentPrefix starts the name of every host segment this package creates:
// SegmentPrefix + tag + "-" + random + "-r" + rank.
const SegmentPrefix = "cpcache-slab-"

// hostRegion is a mapped host shared-memory segment.
type hostRegion struct {
	path string // the segment's path; unlinked once every member mapped it
	mem  []byte // the mapping; nil after close
}

// createHost creates, sizes and maps a new 0600 segment for rank's slab.
func createHost(spec Spec, rank int) (*hostRegion, error) {
	var nonce [12]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("slab: segment name: %w", err)
	}
	tag := spec.Tag
	if tag != "" {
		tag += "-"
	}
	path := filepath.Join(spec.dir(), fmt.Sprintf("%s%s%s-r%d", SegmentPrefix, tag, hex.EncodeToString(nonce[:]), rank))
	mem, err := shmseg.Create(path, spec.Bytes(), true)
	if err != nil {
		return nil, fmt.Errorf("slab: %w", err)
	}
	return &hostRegion{path: path, mem: mem}, nil
}

// openHost maps a peer's segment after checking that it is a segment of ours: in the spec's
// directory, named with SegmentPrefix, owned by this user, mode 0600, of the agreed size.
func openHost(spec Spec, path string) (*hostRegion, error) {
	if !isSegmentPath(spec, path) {
		return nil, fmt.Errorf("slab: segment path %q is not a %s* segment in %s", path, SegmentPrefix, spec.dir())
	}
	size := spec.Bytes()
	mem, err := shmseg.Open(path, size, func(st *unix.Stat_t) error {
		if st.Uid != uint32(os.Getuid()) || st.Mode&0o777 != 0o600 || st.Size != int64(size) {
			return fmt.Errorf("segment %s has owner %d mode %#o size %d, want owner %d mode 0600 size %d",
				path, st.Uid, st.Mode&0o777, st.Size, os.Getuid(), size)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("slab: %w", err)
	}
	return &hostRegion{path: path, mem: mem}, nil
}

// isSegmentPath reports whether path names a segment of this package in the spec's directory.
func isSegmentPath(spec Spec, path string) bool {
	return filepath.Dir(path) == filepath.Clean(spec.dir()) && strings.HasPrefix(filepath.Base(path), SegmentPrefix)
}

// unlinkSegment removes the segment's name; mappings stay valid. A missing name is not an
// error.
func unlinkSegment(path string) error {
	if err := shmseg.Unlink(path); err != nil {
		return fmt.Errorf("slab: %w", err)
	}
	return nil
}

// close unmaps the region; it is idempotent.
func (h *hostRegion) close() error {
	if h == nil || h.mem == nil {
		return nil
	}
	err := unix.Munmap(h.mem)
	h.mem = nil
	if err != nil {
		return fmt.Errorf("slab: unmap segment %s: %w", h.path, err)
	}
	return nil
}
