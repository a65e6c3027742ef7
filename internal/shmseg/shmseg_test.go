package shmseg

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCreateOpenShare(t *testing.T) {
	old := unix.Umask(0o277) // would strip the owner's write bit without the Fchmod
	defer unix.Umask(old)
	for _, reserve := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "seg")
		mem, err := Create(path, 8192, reserve)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil || st.Mode&0o777 != 0o600 || st.Size != 8192 {
			t.Fatalf("reserve=%v: segment mode %#o size %d (%v), want 0600 and 8192", reserve, st.Mode&0o777, st.Size, err)
		}
		var seen int64
		peer, err := Open(path, 8192, func(st *unix.Stat_t) error { seen = st.Size; return nil })
		if err != nil || seen != 8192 {
			t.Fatalf("reserve=%v: open: %v (check saw size %d)", reserve, err, seen)
		}
		defer unix.Munmap(peer)
		mem[8191] = 42
		if peer[8191] != 42 {
			t.Errorf("reserve=%v: a write through one mapping is not seen through the other", reserve)
		}
		// A second Create on the same name fails and leaves the first segment alone.
		if _, err := Create(path, 4096, reserve); !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), path) {
			t.Errorf("reserve=%v: second create: %v, want EEXIST naming %s", reserve, err, path)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("reserve=%v: failed second create removed the segment: %v", reserve, err)
		}
		if err := Unlink(path); err != nil {
			t.Fatal(err)
		}
		if err := Unlink(path); err != nil {
			t.Errorf("unlink of a missing name: %v, want nil", err)
		}
		if peer[8191] != 42 {
			t.Errorf("mapping changed after unlink")
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	mem, err := Create(path, 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	bad := errors.New("wrong size")
	if _, err := Open(path, 4096, func(*unix.Stat_t) error { return bad }); err != bad {
		t.Errorf("open with a failing check: %v, want the check's error", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link, 4096, func(*unix.Stat_t) error { return nil }); err == nil || !strings.Contains(err.Error(), link) {
		t.Errorf("open through a symlink: %v, want an error naming %s", err, link)
	}
	if _, err := Open(filepath.Join(dir, "missing"), 4096, func(*unix.Stat_t) error { return nil }); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("open of a missing segment: %v, want ErrNotExist", err)
	}
}
