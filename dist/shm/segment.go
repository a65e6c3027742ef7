package shm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// segmentPrefix starts the name of every segment this package creates.
const segmentPrefix = "cpcache-shm-"

// createSegment creates a new segment file in dir with a unique random name, O_EXCL and
// mode 0600, sizes it to l.total, maps it and writes the header. The caller unlinks path
// once every member has mapped it and unmaps mem on Close.
func createSegment(dir string, l layout) (path string, mem []byte, err error) {
	nonce := make([]byte, nonceLen)
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, fmt.Errorf("shm: random segment name: %w", err)
	}
	path = filepath.Join(dir, segmentPrefix+hex.EncodeToString(nonce))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", nil, fmt.Errorf("shm: create segment %s: %w", path, err)
	}
	defer unix.Close(fd)
	// The umask can only remove bits; make sure no group/other bit survives either way.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		unix.Unlink(path)
		return "", nil, fmt.Errorf("shm: chmod segment %s: %w", path, err)
	}
	if err := unix.Ftruncate(fd, int64(l.total)); err != nil {
		unix.Unlink(path)
		return "", nil, fmt.Errorf("shm: size segment %s to %d bytes: %w", path, l.total, err)
	}
	mem, err = unix.Mmap(fd, 0, l.total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Unlink(path)
		return "", nil, fmt.Errorf("shm: map segment %s (%d bytes): %w", path, l.total, err)
	}
	l.writeHeader(mem, nonce)
	return path, mem, nil
}

// openSegment maps an existing segment created by createSegment for the same layout.
func openSegment(path string, l layout) ([]byte, error) {
	nonce, err := nonceOf(path)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open segment %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: stat segment %s: %w", path, err)
	}
	if st.Size != int64(l.total) {
		return nil, fmt.Errorf("shm: segment %s is %d bytes, want %d (options differ across members?)", path, st.Size, l.total)
	}
	mem, err := unix.Mmap(fd, 0, l.total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map segment %s (%d bytes): %w", path, l.total, err)
	}
	if err := l.checkHeader(mem, nonce); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("shm: segment %s: %w", path, err)
	}
	return mem, nil
}

func nonceOf(path string) ([]byte, error) {
	base := filepath.Base(path)
	name, ok := strings.CutPrefix(base, segmentPrefix)
	nonce, err := hex.DecodeString(name)
	if !ok || err != nil || len(nonce) != nonceLen {
		return nil, fmt.Errorf("shm: %q is not a segment name made by this package", path)
	}
	return nonce, nil
}

// unlinkSegment removes the segment's name; mappings stay valid.
func unlinkSegment(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("shm: unlink segment %s: %w", path, err)
	}
	return nil
}
