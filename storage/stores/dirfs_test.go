package stores

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveAllReportsALinkItIsHanded: removeAll of an entry that is a link (a directory
// replaced by a link after it was listed) removes the link, never its target, and reports it. The kernel refuses such a link
// with ENOTDIR (O_DIRECTORY is checked before O_NOFOLLOW), which was taken for a file: the
// link went unreported.
func TestRemoveAllReportsALinkItIsHanded(t *testing.T) {
	dir, victim := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var links []string
	for _, name := range []string{"l", "f"} {
		if err := removeAll(context.Background(), fd, name, filepath.Join(dir, name), 0, func(p string) { links = append(links, p) }); err != nil {
			t.Fatalf("removeAll(%s): %v", name, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", name, err)
		}
	}
	if len(links) != 1 || links[0] != filepath.Join(dir, "l") {
		t.Errorf("links reported: %v, want only %s", links, filepath.Join(dir, "l"))
	}
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Errorf("the link's target lost its file: %v", err)
	}
}
