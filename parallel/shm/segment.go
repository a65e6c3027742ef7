package shm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/shmseg"
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
	if mem, err = shmseg.Create(path, l.total, false); err != nil {
		return "", nil, fmt.Errorf("shm: %w", err)
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
	mem, err := shmseg.Open(path, l.total, func(st *unix.Stat_t) error {
		if st.Size != int64(l.total) {
			return fmt.Errorf("segment %s is %d bytes, want %d (options differ across members?)", path, st.Size, l.total)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
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
	if err := shmseg.Unlink(path); err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	return nil
}
