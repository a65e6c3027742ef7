package storage

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// dirStore is the directory backend. Layout under the root:
//
//	<root>/<namespace hex>/<first hash byte hex>/<hash hex>      one file per page
//	<root>/<namespace hex>/<xx>/.tmp-*                           writes in progress
//
// A value is written to a temporary file in its final directory and renamed into place, so
// a reader never sees a partial file under a page's name; a torn file left by a crash or a
// foreign file is rejected by the header and checksums (format.go).
type dirStore struct {
	base
	nsDir string // <root>/<namespace hex>
}

func openDir(root string, opts Options) (*dirStore, error) {
	root = filepath.Clean(root)
	s := &dirStore{base: base{backend: "file", where: root, ns: opts.Namespace.ID(), opts: opts}}
	s.nsDir = filepath.Join(root, opts.Namespace.String())
	if fi, err := os.Stat(root); err == nil && !fi.IsDir() {
		return nil, &OpError{Backend: "file", Where: root, Op: "open", Kind: ErrBadArgument, Err: errors.New("not a directory")}
	}
	if err := os.MkdirAll(s.nsDir, 0o750); err != nil {
		return nil, &OpError{Backend: "file", Where: root, Op: "open", Err: err}
	}
	if s.opts.auth == nil {
		key, err := LoadOrCreateKeyFile(filepath.Join(root, DirKeyFile))
		if err != nil {
			return nil, &OpError{Backend: "file", Where: root, Op: "open", Err: err}
		}
		s.opts.auth = newAuthenticator(key)
	}
	return s, nil
}

// path returns the fan-out directory and the file name of key (one allocation).
func (s *dirStore) path(k Key) (dir, file string) {
	const hexLen = 2 * (KeySize - NamespaceSize)
	buf := make([]byte, 0, len(s.nsDir)+4+hexLen)
	buf = append(buf, s.nsDir...)
	buf = append(buf, filepath.Separator)
	buf = hex.AppendEncode(buf, k[NamespaceSize:NamespaceSize+1])
	buf = append(buf, filepath.Separator)
	buf = hex.AppendEncode(buf, k[NamespaceSize:])
	file = string(buf)
	return file[:len(file)-hexLen-1], file
}

// openRegular opens name for reading, without waiting: O_NONBLOCK makes the open of a FIFO
// that has no writer (or of a device) return at once, where a plain open would block the
// call past its deadline, forever. It returns the file and its stat; a file that is not a
// regular one (a directory, a FIFO, a device) is closed again and reported by ok == false.
func openRegular(name string) (f *os.File, fi fs.FileInfo, ok bool, err error) {
	f, err = os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, false, err
	}
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return nil, nil, false, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fi, false, nil
	}
	return f, fi, true, nil
}

func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// Exists on the directory backend authenticates what it counts. With present == nil (the
// cheap "how much of this prefix is stored" query, followed by a Get that verifies the rest)
// it checks headers; with present (what a backup asks before writing) whole values, so that
// a damaged or forged one reads as absent and the backup rewrites it.
func (s *dirStore) Exists(ctx context.Context, keys []Key, present []bool) (int, error) {
	flags, ctx, cancel, err := s.beginLookup(ctx, "exists", keys, nil, present)
	if err != nil {
		return 0, err
	}
	defer cancel()
	err = forEach(ctx, len(keys), s.opts.Workers, present == nil, func(i int) (bool, error) {
		var ok bool
		var err error
		if derr := s.detach(ctx, "exists", func() { ok, err = s.existsOne(keys[i], present != nil) }, nil); derr != nil {
			return false, derr
		}
		flags[i] = ok
		return ok, err
	})
	if err != nil {
		return leading(flags), s.err("exists", kindOf(ctx, err), err)
	}
	return leading(flags), nil
}

func (s *dirStore) Get(ctx context.Context, keys []Key, dst [][]byte, found []bool) (int, error) {
	dst = buffers(dst)
	flags, ctx, cancel, err := s.beginLookup(ctx, "get", keys, dst, found)
	if err != nil {
		return 0, err
	}
	defer cancel()
	err = forEach(ctx, len(keys), s.opts.Workers, found == nil, func(i int) (bool, error) {
		// The file is read into a buffer of the read's own (see detach): an abandoned read
		// never writes into dst[i], which the caller reuses once Get returned.
		buf := getBuffer(len(dst[i]))
		var ok bool
		var err error
		if derr := s.detach(ctx, "get", func() { ok, err = s.getOne(keys[i], *buf) }, func() { putBuffer(buf) }); derr != nil {
			return false, derr
		}
		if ok {
			copy(dst[i], *buf)
			s.stats.hits.Add(1)
			s.stats.bytesRead.Add(uint64(len(dst[i])))
		}
		putBuffer(buf)
		flags[i] = ok
		return ok, err
	})
	if err != nil {
		return leading(flags), s.err("get", kindOf(ctx, err), err)
	}
	return leading(flags), nil
}

// existsOne reports whether k holds a value whose header is genuine (its MAC verifies for
// this key) and whose length matches the header; with full, whether the whole value is
// genuine. A value that fails is corrupt (counted, reported, purged), so the next backup of
// the page replaces it.
func (s *dirStore) existsOne(k Key, full bool) (bool, error) {
	_, name := s.path(k)
	f, fi, regular, err := openRegular(name)
	if err != nil {
		if isMissing(err) {
			return false, nil
		}
		return false, err
	}
	if !regular {
		if !fi.IsDir() {
			s.corruptIn("exists", k, fmt.Errorf("file %s: not a regular file (%v)", name, fi.Mode().Type()))
		}
		return false, nil
	}
	defer f.Close()
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return s.readFailed("exists", k, name, err, "header")
	}
	if err := s.checkHeader(hdr[:], k, int(fi.Size()-HeaderSize)); err != nil {
		s.corruptIn("exists", k, fmt.Errorf("file %s: %w", name, err))
		return false, nil
	}
	if full {
		reason, err := s.opts.auth.checkPayloadFrom(hdr[:], f)
		if err != nil {
			return false, err
		}
		if reason != nil {
			s.corruptIn("exists", k, fmt.Errorf("file %s: %w", name, reason))
			return false, nil
		}
	}
	return true, nil
}

// getOne reads one page into dst. A missing or corrupt file is (false, nil); a hit is
// counted by Get, once it is delivered.
func (s *dirStore) getOne(k Key, dst []byte) (bool, error) {
	_, name := s.path(k)
	f, fi, regular, err := openRegular(name)
	if err != nil {
		if isMissing(err) {
			s.stats.misses.Add(1)
			return false, nil
		}
		return false, err
	}
	if !regular {
		if fi.IsDir() { // the store's layout is broken: an I/O error, as reading it is
			return false, &fs.PathError{Op: "read", Path: name, Err: syscall.EISDIR}
		}
		s.corrupt(k, fmt.Errorf("file %s: not a regular file (%v)", name, fi.Mode().Type()))
		return false, nil
	}
	defer f.Close()
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return s.readFailed("get", k, name, err, "header")
	}
	if err := s.checkHeader(hdr[:], k, len(dst)); err != nil {
		s.corrupt(k, fmt.Errorf("file %s: %w", name, err))
		return false, nil
	}
	if _, err := io.ReadFull(f, dst); err != nil {
		return s.readFailed("get", k, name, err, "payload")
	}
	var extra [1]byte
	if n, err := f.Read(extra[:]); n != 0 || err != io.EOF {
		if n == 0 && err != nil {
			return false, err
		}
		s.corrupt(k, fmt.Errorf("file %s: longer than header+payload", name))
		return false, nil
	}
	if err := s.checkPayload(hdr[:], dst); err != nil {
		s.corrupt(k, fmt.Errorf("file %s: %w", name, err))
		return false, nil
	}
	return true, nil
}

// readFailed classifies a short read (a torn file: corrupt, a miss) from an I/O error.
func (s *dirStore) readFailed(op string, k Key, name string, err error, what string) (bool, error) {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		s.corruptIn(op, k, fmt.Errorf("file %s: truncated %s", name, what))
		return false, nil
	}
	return false, err
}

func (s *dirStore) Put(ctx context.Context, keys []Key, src [][]byte) error {
	src = buffers(src)
	ctx, cancel, err := s.beginCall(ctx, "put", keys, src, nil)
	if err != nil {
		return err
	}
	defer cancel()
	err = forEach(ctx, len(keys), s.opts.Workers, false, func(i int) (bool, error) {
		// The file is written from a copy (see detach): an abandoned write never reads
		// src[i], which the caller reuses once Put returned.
		buf := getBuffer(len(src[i]))
		copy(*buf, src[i])
		var err error
		if derr := s.detach(ctx, "put", func() { err = s.putOne(keys[i], *buf) }, func() { putBuffer(buf) }); derr != nil {
			return false, derr
		}
		putBuffer(buf)
		return true, err
	})
	if err != nil {
		return s.err("put", kindOf(ctx, err), err)
	}
	return nil
}

// putOne writes one page. A Clear of the namespace that runs meanwhile (another instance's
// flush) may move the fan-out directory aside, the temporary file with it, before the file
// is created or renamed: the page was then put concurrently with the Clear, and is cleared
// by it (as if written just before it), not an error.
func (s *dirStore) putOne(k Key, payload []byte) (err error) {
	dir, name := s.path(k)
	f, err := os.CreateTemp(dir, ".tmp-")
	if isMissing(err) {
		err = os.MkdirAll(dir, 0o750)
		if errors.Is(err, syscall.EEXIST) {
			// Made by another writer after MkdirAll looked, and moved aside by a Clear
			// before it checked that it is a directory.
			return s.clearedPut(payload)
		}
		if err == nil {
			f, err = os.CreateTemp(dir, ".tmp-")
		}
		if errors.Is(err, syscall.ENOENT) { // moved aside again
			return s.clearedPut(payload)
		}
	}
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	var hdr [HeaderSize]byte
	s.encodeHeader(&hdr, k, payload)
	if _, err = f.Write(hdr[:]); err != nil {
		return err
	}
	if _, err = f.Write(payload); err != nil {
		return err
	}
	if s.opts.Fsync {
		if err = f.Sync(); err != nil {
			return err
		}
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, name); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			os.Remove(tmp) // gone with its directory
			return s.clearedPut(payload)
		}
		return err
	}
	if s.opts.Fsync {
		if err = syncDir(dir); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				return s.clearedPut(payload)
			}
			return err
		}
	}
	s.stats.puts.Add(1)
	s.stats.bytesWritten.Add(uint64(len(payload)))
	return nil
}

// clearedPut counts a put that a concurrent Clear removed with the namespace (putOne).
func (s *dirStore) clearedPut(payload []byte) error {
	s.stats.puts.Add(1)
	s.stats.bytesWritten.Add(uint64(len(payload)))
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *dirStore) Delete(ctx context.Context, keys []Key) error {
	ctx, cancel, err := s.beginCall(ctx, "delete", keys, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	err = forEach(ctx, len(keys), s.opts.Workers, false, func(i int) (bool, error) {
		var err error
		if derr := s.detach(ctx, "delete", func() { err = s.deleteOne(keys[i]) }, nil); derr != nil {
			return false, derr
		}
		return err == nil, err
	})
	if err != nil {
		return s.err("delete", kindOf(ctx, err), err)
	}
	return nil
}

// deleteOne removes the file of k; a missing one is not an error.
func (s *dirStore) deleteOne(k Key) error {
	_, name := s.path(k)
	if err := os.Remove(name); err != nil && !isMissing(err) {
		return err
	}
	s.stats.deletes.Add(1)
	return nil
}

// Clear moves the namespace directory aside (one atomic rename, so no reader sees half of
// it) and removes it, with what earlier Clears left aside (one that crashed, or ran out of
// time). Removal is bounded by the call's deadline: the namespace is clear once it is moved
// aside, and what is left of the trash then goes with the next Clear. Other namespaces
// under the same root are untouched.
func (s *dirStore) Clear(ctx context.Context) error {
	ctx, cancel, err := s.beginCall(ctx, "clear", nil, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	if err := ctx.Err(); err != nil {
		return s.err("clear", ErrUnavailable, err)
	}
	// One detached operation (see detach): abandoned at the deadline, its removal of the
	// trash stops at its next check of ctx, which ends with the call.
	if derr := s.detach(ctx, "clear", func() { err = s.clear(ctx) }, nil); derr != nil {
		return s.err("clear", kindOf(ctx, derr), derr)
	}
	return err
}

// clear is Clear's work, in the call's context.
func (s *dirStore) clear(ctx context.Context) error {
	root := filepath.Dir(s.nsDir)
	trashPrefix := ".trash-" + filepath.Base(s.nsDir) + "-"
	trash, err := os.MkdirTemp(root, trashPrefix)
	if err != nil {
		return s.err("clear", nil, err)
	}
	moved := filepath.Join(trash, "ns")
	if err := os.Rename(s.nsDir, moved); err != nil && !isMissing(err) {
		os.Remove(trash)
		return s.err("clear", nil, err)
	}
	if err := os.MkdirAll(s.nsDir, 0o750); err != nil {
		return s.err("clear", nil, err)
	}
	// The namespace is empty: remove the trash (a concurrent Clear may be removing the
	// same; both succeed). Another Clear's trash is removed only once its namespace is in
	// it: removed between its MkdirTemp and its Rename, that Clear's Rename would fail as
	// if the namespace were missing, and it would report success having cleared nothing.
	old, _ := filepath.Glob(filepath.Join(root, trashPrefix+"*"))
	for _, dir := range old {
		if dir != trash {
			if _, err := os.Lstat(filepath.Join(dir, "ns")); err != nil {
				continue
			}
		}
		if err := removeBy(ctx, dir); err != nil {
			if ctx.Err() != nil {
				return nil // cleared; the rest of the trash goes with the next Clear
			}
			return s.err("clear", nil, err)
		}
	}
	return nil
}

// removeBy removes dir as os.RemoveAll does, a directory two levels down at a time (a
// namespace's fan-out directories under <trash>/ns), and stops with ctx's error when it is
// done.
func removeBy(ctx context.Context, dir string) error {
	subs, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	for _, sub := range subs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := removeAll(sub); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return removeAll(dir)
}

// removeAll is os.RemoveAll, repeated when a directory was not empty at its removal: a
// writer whose path lookup passed the namespace directory before Clear moved it aside may
// still create its temporary file (or fan-out directory) in the moved tree.
func removeAll(path string) error {
	var err error
	for range 4 {
		if err = os.RemoveAll(path); !errors.Is(err, syscall.ENOTEMPTY) {
			return err
		}
	}
	return err
}

func (s *dirStore) Close() error {
	if s == nil {
		return nil
	}
	s.closed.Store(true)
	return nil
}

// kindOf classifies an error of a file operation: the context ending is ErrUnavailable
// (the call did not finish in time), as is a call refused because too many file system
// operations are stuck (ErrStuck); anything else (permissions, a full disk) has no kind.
func kindOf(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) || errors.Is(err, ErrStuck) {
		return ErrUnavailable
	}
	return nil
}
