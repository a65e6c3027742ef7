package shm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/shmseg"
)

// segmentPrefix starts the name of every segment this package creates.
const segmentPrefix = "cpcache-shm-"

// createSegment creates a new anonymous segment (see internal/shmseg) named with a random
// nonce, sizes it to l.total, maps it, writes the header and offers it to the members. The
// caller calls Unshare once every member has mapped it and unmaps Mem on Close.
func createSegment(l layout) (*shmseg.Segment, error) {
	nonce := make([]byte, nonceLen)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("shm: random segment name: %w", err)
	}
	seg, err := shmseg.Create(segmentPrefix+hex.EncodeToString(nonce), l.total, false)
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	l.writeHeader(seg.Mem, nonce)
	return seg, nil
}

// openSegment maps the segment offered at handle by createSegment for the same layout.
func openSegment(ctx context.Context, handle string, l layout) ([]byte, error) {
	nonce, err := nonceOf(handle)
	if err != nil {
		return nil, err
	}
	mem, err := shmseg.Map(ctx, handle, l.total)
	if err != nil {
		return nil, fmt.Errorf("shm: %w (options differ across members?)", err)
	}
	if err := l.checkHeader(mem, nonce); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("shm: segment %s: %w", handle, err)
	}
	return mem, nil
}

// nonceOf is the nonce in the name of a handle made by createSegment: shmseg's handle is
// "@" + name + "-" + its own random suffix (see shmseg.IsHandle).
func nonceOf(handle string) ([]byte, error) {
	rest, ok := strings.CutPrefix(handle, "@"+segmentPrefix)
	name, _, _ := strings.Cut(rest, "-")
	nonce, err := hex.DecodeString(name)
	if !ok || err != nil || len(nonce) != nonceLen {
		return nil, fmt.Errorf("shm: %q is not a segment handle made by this package", handle)
	}
	return nonce, nil
}
