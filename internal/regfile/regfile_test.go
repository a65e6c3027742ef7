package regfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRefusesAtOnce: a named pipe (read without a writer, written without a reader), a
// directory and a character device are refused at once with ErrNotRegular naming the path
// and its kind, directly and within an os.Root; a regular file opens.
func TestRefusesAtOnce(t *testing.T) {
	dir := t.TempDir()
	fifo, file := filepath.Join(dir, "fifo"), filepath.Join(dir, "file")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, tc := range []struct {
		what, name, kind string
		open             func() error
	}{
		{"read", fifo, "a named pipe", func() error { _, _, err := Open(fifo); return err }},
		{"write", fifo, "a named pipe", func() error { _, _, err := OpenFile(fifo, os.O_WRONLY|os.O_CREATE, 0o600); return err }},
		{"read", dir, "a directory", func() error { _, _, err := Open(dir); return err }},
		{"read", "/dev/null", "a character device", func() error { _, _, err := Open("/dev/null"); return err }},
		{"root read", "fifo", "a named pipe", func() error { _, err := ReadFileIn(root, "fifo"); return err }},
		{"root write", "fifo", "a named pipe", func() error { _, _, err := OpenFileIn(root, "fifo", os.O_WRONLY, 0); return err }},
	} {
		done := make(chan error, 1)
		go func() { done <- tc.open() }()
		select {
		case err := <-done:
			var re *Error
			if !errors.Is(err, ErrNotRegular) || !errors.As(err, &re) || re.Kind != tc.kind ||
				err.Error() != tc.name+": not a regular file ("+tc.kind+")" {
				t.Errorf("%s %s: %v, want ErrNotRegular naming it and %s", tc.what, tc.name, err, tc.kind)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s %s: still waiting in open after 10s", tc.what, tc.name)
		}
	}
	if b, err := ReadFileIn(root, "file"); err != nil || string(b) != "x" {
		t.Errorf("ReadFileIn(file) = %q, %v", b, err)
	}
	f, fi, err := Open(file)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("Open(file) = %v, %v", fi, err)
	}
	f.Close()
}
