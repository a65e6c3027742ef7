package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/regfile"
)

// outputStreams are the output paths that may name something other than a regular file:
// this process's own standard streams and the null device.
var outputStreams = []string{"/dev/stdout", "/dev/stderr", "/dev/null"}

// isOutputStream reports whether path is one of outputStreams.
func isOutputStream(path string) bool { return slices.Contains(outputStreams, filepath.Clean(path)) }

// openOutput opens path for writing, creating it if needed, without truncating it and
// without ever blocking: it must be a regular file (or one of outputStreams). A named pipe
// is refused whether or not a reader has it open (without one, the open would wait
// forever), and so are directories, devices and sockets. A stream is opened to append: a
// standard stream redirected to a file is opened anew at offset 0, and what the process
// wrote to it before would be overwritten.
func openOutput(flag, path string) (f *os.File, created bool, err error) {
	if isOutputStream(path) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, false, fmt.Errorf("%s %s: %w", flag, path, err)
		}
		return f, false, nil
	}
	_, statErr := os.Stat(path)
	created = errors.Is(statErr, fs.ErrNotExist)
	// Never waits: a FIFO without a reader is refused (regfile) instead of blocking the open.
	f, _, err = regfile.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	var re *regfile.Error
	if errors.As(err, &re) {
		return nil, false, fmt.Errorf("%s %s: not a regular file (%s)", flag, path, re.Kind)
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return f, created, nil
}

// checkOutputFile checks, before any rank starts, that path can be written (openOutput): it
// opens it, makes an empty write (which fails on a file system that refuses writes) and
// checks that its file system has room. A file the check created is removed again, so a
// failed run leaves none.
func checkOutputFile(flag, path string) error {
	f, created, err := openOutput(flag, path)
	if err != nil {
		return err
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
