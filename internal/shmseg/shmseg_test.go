package shmseg

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// memfdsNamed counts this process's open descriptors that are memfds named name.
func memfdsNamed(t *testing.T, name string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, "/memfd:"+name) {
			n++
		}
	}
	return n
}

func TestCreateMapUnshare(t *testing.T) {
	ctx := context.Background()
	for _, reserve := range []bool{false, true} {
		name := "shmseg-test-" + t.Name()
		seg, err := Create(name, 8192, reserve)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(seg.Mem)
		if !IsHandle(seg.Handle, name) {
			t.Errorf("handle %q does not start with @%s", seg.Handle, name)
		}
		if got := memfdsNamed(t, name); got != 1 {
			t.Errorf("reserve=%v: %d memfds open while shared, want 1", reserve, got)
		}
		peer, err := Map(ctx, seg.Handle, 8192)
		if err != nil {
			t.Fatalf("reserve=%v: map: %v", reserve, err)
		}
		defer unix.Munmap(peer)
		seg.Mem[8191] = 42
		if peer[8191] != 42 {
			t.Errorf("reserve=%v: a write through one mapping is not seen through the other", reserve)
		}
		if _, err := Map(ctx, seg.Handle, 4096); err == nil || !strings.Contains(err.Error(), "want a regular file of 4096 bytes") {
			t.Errorf("map with the wrong size: %v, want a size error", err)
		}
		if err := seg.Unshare(); err != nil {
			t.Fatal(err)
		}
		if err := seg.Unshare(); err != nil {
			t.Errorf("second unshare: %v, want nil", err)
		}
		if got := memfdsNamed(t, name); got != 0 {
			t.Errorf("reserve=%v: %d memfds open after Unshare, want 0", reserve, got)
		}
		if _, err := Map(ctx, seg.Handle, 8192); err == nil || !strings.Contains(err.Error(), seg.Handle) {
			t.Errorf("map after unshare: %v, want an error naming the handle", err)
		}
		if peer[8191] != 42 {
			t.Errorf("mapping changed after unshare")
		}
	}
	var nilSeg *Segment
	if err := nilSeg.Unshare(); err != nil {
		t.Errorf("nil Unshare: %v", err)
	}
}

func TestMapRefuses(t *testing.T) {
	ctx := context.Background()
	if _, err := Map(ctx, "/dev/shm/x", 4096); err == nil || !strings.Contains(err.Error(), "not an abstract socket") {
		t.Errorf("map of a path: %v, want a handle error", err)
	}
	if _, err := Map(ctx, "@shmseg-test-nobody-listens", 4096); err == nil {
		t.Error("map of a handle nobody serves succeeded")
	}
	if _, err := Create("shmseg-test-zero", 0, false); err == nil {
		t.Error("create of 0 bytes succeeded")
	}
	// A server that accepts but never sends: Map gives up when its context ends.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@shmseg-test-silent-" + t.Name(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Map(cctx, ln.Addr().String(), 4096); err == nil {
		t.Error("map from a silent server succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("map ignored its context for %v", d)
	}
}
