package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// checkOutputFile checks, before any rank starts, that path can be written: it opens it for
// writing (creating it if needed, without truncating an existing file), makes an empty
// write (which fails on /dev/full) and, for a regular file, checks that its file system has
// room. A file the check created is removed again, so a failed run leaves none.
func checkOutputFile(flag, path string) error {
	_, statErr := os.Stat(path)
	created := os.IsNotExist(statErr)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	defer func() {
		f.Close()
		if created {
			os.Remove(path)
		}
	}()
	if _, err := unix.Write(int(f.Fd()), nil); err != nil {
		return fmt.Errorf("%s %s: cannot write: %w", flag, path, err)
	}
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		var fs unix.Statfs_t
		if unix.Fstatfs(int(f.Fd()), &fs) == nil && fs.Bavail == 0 {
			return fmt.Errorf("%s %s: no space left on its file system", flag, path)
		}
	}
	return nil
}

// sameFile reports whether paths a and b name one file: the same absolute path, or, when
// both exist, the same file under two names (a link).
func sameFile(a, b string) bool {
	absA, errA := filepath.Abs(a)
	absB, errB := filepath.Abs(b)
	if errA == nil && errB == nil && absA == absB {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}
