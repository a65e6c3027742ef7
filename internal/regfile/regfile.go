// Package regfile opens files that must be regular files (inputs, reports, key files, a
// rendezvous store's keys) without ever waiting in open and without taking a controlling
// terminal: a named pipe, a directory, a device or a socket is refused at once with an error
// naming the path and its kind.
package regfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ErrNotRegular is wrapped by the error for a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// Error is a path that is not a regular file; it wraps ErrNotRegular.
type Error struct {
	Path string
	Kind string // Kind of its mode: "a named pipe", "a directory", ...
}

func (e *Error) Error() string { return e.Path + ": " + ErrNotRegular.Error() + " (" + e.Kind + ")" }
func (e *Error) Unwrap() error { return ErrNotRegular }

// Kind names the kind of file a mode is, for errors.
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsRegular():
		return "a regular file"
	}
	return "not a regular file"
}

// flags are added to every open: O_NONBLOCK makes the open of a FIFO (for reading without a
// writer: at once; for writing without a reader: ENXIO) or of a device return instead of
// waiting, forever if nobody comes; for a regular file it changes nothing. O_NOCTTY: a
// terminal device opened here never becomes this process's controlling terminal.
const flags = syscall.O_NONBLOCK | syscall.O_NOCTTY

// OpenFile opens name with flag (and perm, for O_CREATE) and returns it with its stat when
// it is a regular file. Anything else is closed again and refused with an *Error (the stat is
// still returned); a FIFO opened for writing without a reader is refused the same way.
func OpenFile(name string, flag int, perm fs.FileMode) (*os.File, fs.FileInfo, error) {
	return check(name, func() (*os.File, error) { return os.OpenFile(name, flag|flags, perm) }, os.Stat)
}

// Open opens name for reading (OpenFile with O_RDONLY).
func Open(name string) (*os.File, fs.FileInfo, error) { return OpenFile(name, os.O_RDONLY, 0) }

// OpenFileIn is OpenFile of name within root (os.Root: nothing outside it is reached).
func OpenFileIn(root *os.Root, name string, flag int, perm fs.FileMode) (*os.File, fs.FileInfo, error) {
	return check(name, func() (*os.File, error) { return root.OpenFile(name, flag|flags, perm) }, root.Stat)
}

// ReadFileIn returns the contents of name within root if it is a regular file.
func ReadFileIn(root *os.Root, name string) ([]byte, error) {
	f, _, err := OpenFileIn(root, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

func check(name string, open func() (*os.File, error), stat func(string) (fs.FileInfo, error)) (*os.File, fs.FileInfo, error) {
	f, err := open()
	if errors.Is(err, syscall.ENXIO) {
		// A write-only open of a FIFO that has no reader (or of a device that is absent):
		// name the FIFO's kind when it is one.
		if fi, serr := stat(name); serr == nil && fi.Mode()&fs.ModeNamedPipe != 0 {
			return nil, fi, &Error{Path: name, Kind: Kind(fi.Mode())}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fi, &Error{Path: name, Kind: Kind(fi.Mode())}
	}
	return f, fi, nil
}
