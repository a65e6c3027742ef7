package slab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("slab: create segment: %w", err)
	}
	defer f.Close()
	size := spec.Bytes()
	// Reserve the memory now: a sparse segment would turn a full /dev/shm into SIGBUS later.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		if err != syscall.EOPNOTSUPP {
			os.Remove(path)
			return nil, fmt.Errorf("slab: allocate %d bytes for segment %s: %w", size, path, err)
		}
		if err := f.Truncate(int64(size)); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("slab: size segment %s to %d bytes: %w", path, size, err)
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("slab: map segment %s (%d bytes): %w", path, size, err)
	}
	return &hostRegion{path: path, mem: mem}, nil
}

// openHost maps a peer's segment after checking that it is a segment of ours: in the spec's
// directory, named with SegmentPrefix, owned by this user, mode 0600, of the agreed size.
func openHost(spec Spec, path string) (*hostRegion, error) {
	if !isSegmentPath(spec, path) {
		return nil, fmt.Errorf("slab: segment path %q is not a %s* segment in %s", path, SegmentPrefix, spec.dir())
	}
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("slab: open segment: %w", err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("slab: stat segment %s: %w", path, err)
	}
	size := spec.Bytes()
	if st.Uid != uint32(os.Getuid()) || st.Mode&0o777 != 0o600 || st.Size != int64(size) {
		return nil, fmt.Errorf("slab: segment %s has owner %d mode %#o size %d, want owner %d mode 0600 size %d",
			path, st.Uid, st.Mode&0o777, st.Size, os.Getuid(), size)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("slab: map segment %s (%d bytes): %w", path, size, err)
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
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("slab: unlink segment: %w", err)
	}
	return nil
}

// close unmaps the region; it is idempotent.
func (h *hostRegion) close() error {
	if h == nil || h.mem == nil {
		return nil
	}
	err := syscall.Munmap(h.mem)
	h.mem = nil
	if err != nil {
		return fmt.Errorf("slab: unmap segment %s: %w", h.path, err)
	}
	return nil
}
