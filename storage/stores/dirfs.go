package stores

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// dirFS is the directory store's view of its root: every file under the root is opened,
// created, renamed and removed relative to the root's handle, and no symbolic link under it
// is ever followed. The root is shared with whoever can write it, and a link planted there
// (a namespace, fan-out, trash or page entry pointing elsewhere) would otherwise make reads,
// writes and removals act on whatever it points to. The root itself is opened by the path
// the operator named, links included (it is theirs to choose, not a store writer's).
//
// openat2 with RESOLVE_NO_SYMLINKS refuses a link anywhere on a path in one call; where the
// kernel does not have it (before Linux 5.6, or a sandbox that filters it), each component
// is opened in turn with O_NOFOLLOW. Either way a link on the path fails the open with ELOOP
// (or ENOTDIR), which linkOn then attributes to the entry that is a link.
type dirFS struct {
	root *os.File // the store directory; its descriptor is the base of every path
	fd   int      // root's descriptor
	walk bool     // open component by component: openat2 is not available
	path string   // the root's path, for messages

	// The root stays open while a call uses it (acquire, release), even past close: a
	// descriptor closed under a running call could be reused for another directory, and
	// the call would then act there.
	mu     sync.Mutex // protects refs and closed
	refs   int
	closed bool
	// onClose, if set, runs when the root is closed (the capacity's files, dircap.go).
	onClose func()
}

// closeRoot closes the root and what goes with it, once.
func (d *dirFS) closeRoot() {
	d.root.Close()
	if d.onClose != nil {
		d.onClose()
	}
}

// forceWalk makes openDirFS choose the component walk (tests of the fallback).
var forceWalk bool

func openDirFS(path string) (*dirFS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.IsDir() {
		f.Close()
		return nil, errNotDir
	}
	d := &dirFS{root: f, fd: int(f.Fd()), path: path, walk: forceWalk}
	if !d.walk {
		fd, err := unix.Openat2(d.fd, ".", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if err == nil {
			unix.Close(fd)
		} else {
			d.walk = true // ENOSYS (an older kernel) or EPERM (a seccomp filter)
		}
	}
	return d, nil
}

var errNotDir = errors.New("not a directory")

// acquire holds the root open for a call; it is false once the store is closed.
func (d *dirFS) acquire() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.refs++
	return true
}

func (d *dirFS) release() {
	d.mu.Lock()
	d.refs--
	last := d.closed && d.refs == 0
	d.mu.Unlock()
	if last {
		d.closeRoot()
	}
}

// close closes the root once no call holds it. It is idempotent.
func (d *dirFS) close() {
	d.mu.Lock()
	last := !d.closed && d.refs == 0
	d.closed = true
	d.mu.Unlock()
	if last {
		d.closeRoot()
	}
}

// abs is the path of rel (relative to the root), for messages.
func (d *dirFS) abs(rel string) string { return filepath.Join(d.path, rel) }

// open opens rel, a path under the root, without following a link in any component.
// O_CLOEXEC and O_NOFOLLOW are added to flags.
func (d *dirFS) open(rel string, flags int, mode uint32) (int, error) {
	flags |= unix.O_CLOEXEC | unix.O_NOFOLLOW
	if !d.walk {
		how := &unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: unix.RESOLVE_NO_SYMLINKS}
		for {
			fd, err := unix.Openat2(d.fd, rel, how)
			if err != unix.EINTR {
				return fd, err
			}
		}
	}
	dir := d.fd
	for {
		i := strings.IndexByte(rel, '/')
		if i < 0 {
			break
		}
		next, err := openat(dir, rel[:i], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if dir != d.fd {
			unix.Close(dir)
		}
		if err != nil {
			return -1, err
		}
		dir, rel = next, rel[i+1:]
	}
	fd, err := openat(dir, rel, flags, mode)
	if dir != d.fd {
		unix.Close(dir)
	}
	return fd, err
}

// openDir opens the directory rel for use as the base of *at calls.
func (d *dirFS) openDir(rel string) (int, error) {
	return d.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// openat is openat(2), repeated when a signal interrupted it (possible on network and FUSE
// filesystems).
func openat(dir int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dir, name, flags, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// isLinkErr reports whether err is how an open refuses a link on its path (ELOOP), or may
// (ENOTDIR: a link where a directory was expected, on the component walk).
func isLinkErr(err error) bool {
	return errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)
}

// linkOn returns the first entry of rel, a path under the root, that is a symbolic link.
func (d *dirFS) linkOn(rel string) (string, bool) {
	for i := 0; ; {
		j := strings.IndexByte(rel[i:], '/')
		prefix := rel
		if j >= 0 {
			prefix = rel[:i+j]
		}
		var st unix.Stat_t
		if unix.Fstatat(d.fd, prefix, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			return "", false
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return prefix, true
		}
		if j < 0 {
			return "", false
		}
		i += j + 1
	}
}

// lstat is fstatat(2) of rel without following a final link (earlier components are
// resolved: callers check them first).
func (d *dirFS) lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d.fd, rel, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// mkdirTemp makes a new directory prefix<random> in the root (mode 0700) and returns its name.
func (d *dirFS) mkdirTemp(prefix string) (string, error) {
	for {
		name := fmt.Sprintf("%s%016x", prefix, rand.Uint64())
		err := unix.Mkdirat(d.fd, name, 0o700)
		if err == nil {
			return name, nil
		}
		if err != unix.EEXIST {
			return "", &os.PathError{Op: "mkdir", Path: d.abs(name), Err: err}
		}
	}
}

// readNames calls fn with the name and type bits (unix.S_IFDIR, S_IFLNK...; 0 when the
// filesystem does not say) of each entry of the directory dir, until fn returns false or an
// error. Entries are read from a fresh descriptor of dir, so dir's own is unchanged.
func readNames(dir int, path string, fn func(name string, typ uint32) (bool, error)) error {
	fd, err := openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	for {
		ents, err := f.ReadDir(256)
		for _, e := range ents {
			var typ uint32
			switch t := e.Type(); {
			case t.IsDir():
				typ = unix.S_IFDIR
			case t&os.ModeSymlink != 0:
				typ = unix.S_IFLNK
			case t.IsRegular():
				typ = unix.S_IFREG
			}
			more, ferr := fn(e.Name(), typ)
			if ferr != nil || !more {
				return ferr
			}
		}
		if err == io.EOF || len(ents) == 0 && err == nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// maxRemoveDepth bounds how deep removeAll descends: the store's trees are three levels
// deep (<trash>/ns/<xx>/<page>); a deeper tree was not made by the store.
const maxRemoveDepth = 8

// removeAll removes the entry name of directory parent and, if it is a directory,
// everything under it, without following links: a link is removed itself (onLink is told
// its path), never what it points to. It returns ctx's error when ctx is done, leaving the
// rest. A directory that a late writer refills while it is emptied is emptied again, a few
// times, before its ENOTEMPTY is returned.
func removeAll(ctx context.Context, parent int, name, path string, depth int, onLink func(path string)) error {
	fd, err := openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	switch {
	case err == unix.ENOENT:
		return nil
	case err == unix.ELOOP || err == unix.ENOTDIR: // a link or a file: remove the entry itself
		// A link is refused with ENOTDIR as a file is (O_DIRECTORY is checked first).
		var st unix.Stat_t
		if onLink != nil && unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			onLink(path)
		}
		if err := unix.Unlinkat(parent, name, 0); err != nil && err != unix.ENOENT {
			return &os.PathError{Op: "unlink", Path: path, Err: err}
		}
		return nil
	case err != nil:
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if depth >= maxRemoveDepth {
		return &os.PathError{Op: "remove", Path: path, Err: errors.New("directory tree deeper than the store makes")}
	}
	for range 4 {
		err := readNames(fd, path, func(sub string, typ uint32) (bool, error) {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			subPath := path + "/" + sub
			if typ == unix.S_IFLNK && onLink != nil {
				onLink(subPath)
			}
			if typ != unix.S_IFDIR {
				err := unix.Unlinkat(fd, sub, 0)
				if err == nil || err == unix.ENOENT {
					return true, nil
				}
				if err != unix.EISDIR && err != unix.EPERM { // EISDIR/EPERM: a directory after all
					return false, &os.PathError{Op: "unlink", Path: subPath, Err: err}
				}
			}
			return true, removeAll(ctx, fd, sub, subPath, depth+1, onLink)
		})
		if err != nil {
			return err
		}
		err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.ENOTEMPTY && err != unix.EEXIST {
			return &os.PathError{Op: "rmdir", Path: path, Err: err}
		}
	}
	return &os.PathError{Op: "rmdir", Path: path, Err: unix.ENOTEMPTY}
}
