package stores

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/storage"
)

// dirStore is the directory backend. Layout under the root:
//
//	<root>/<namespace hex>/<first hash byte hex>/<hash hex>      one file per page
//	<root>/<namespace hex>/<xx>/.tmp-*                           writes in progress
//	<root>/.trash-<namespace hex>-*/ns                           a namespace being cleared
//
// A value is written to a temporary file in its final directory and renamed into place, so
// a reader never sees a partial file under a page's name; a torn file left by a crash or a
// foreign file is rejected by the header and checksums (storage/format.go).
//
// Whoever can write the root can delete pages, never make the store act outside it: every
// path under the root is opened relative to its handle without following symbolic links
// (dirFS). A link found where the store keeps a namespace, fan-out, trash or page entry is
// counted (Stats.Links), reported to Options.OnWarning (ErrLink, with its path; the first
// few of each store) and skipped: Get and Exists read it as a miss (a page that is a link
// is also corrupt, and purged: the link is removed, never its target), Put skips the pages
// it would have written through it, Delete and purges remove nothing through it, and Clear
// removes the link itself, with the namespace, never what it points to. Put replaces a page
// entry that is a link by renaming its file over it (rename does not follow links).
//
// A root that group or others can write is reported once at open (ErrWritableStore), sticky
// or not: the sticky bit keeps others from removing or renaming the store's own entries,
// but not from planting a name before the store makes it (a namespace directory, a trash
// entry) or filling the disk.
//
// Temporary files: a Put's .tmp-* file lives for one write, far less than TempMaxAge. One
// older than that was left by a writer that died (kill -9, a crash) and is removed by the
// first Put of this store into its fan-out directory; a live writer's file, in this process
// or another, is younger and kept. Clear removes them all with the namespace.
type dirStore struct {
	base
	fs     *dirFS
	nsName string // <namespace hex>, the namespace directory relative to the root
	nsDir  string // <root>/<namespace hex>, for messages
	// reaped marks the fan-out directories this store has reaped stale temporary files from.
	reaped [256]atomic.Bool
	// warned counts warnings given about links (at most maxLinkWarnings are reported).
	warned atomic.Int64
	// noWait: the file system serves reads from the page cache without waiting
	// (RWF_NOWAIT), so Get reads cached pages straight into place (getOne); cleared for
	// good the first time it refuses the flag.
	noWait atomic.Bool
	// inPlace counts the pages Get read straight into place (tests).
	inPlace atomic.Uint64
	// cap is the capacity and TTL (dircap.go); nil without either.
	cap *dirCap
}

// TempMaxAge is the age after which a temporary file of a Put is a dead writer's, and
// removed (see dirStore), and after which an empty trash directory is a Clear's that died
// between making it and moving the namespace into it, and removed by the next Clear.
const TempMaxAge = time.Hour

// maxLinkWarnings bounds the links a store reports to Options.OnWarning; further ones are
// only counted, so that a store full of planted links does not flood the log.
const maxLinkWarnings = 8

// openDirGate, when set (tests: FreezeOpen), runs at the start of openDir, before it
// touches the file system, and blocks where a dead mount would.
var openDirGate atomic.Pointer[func(root string)]

// openDirBounded is openDir bounded by Options.Timeout or ctx's deadline, whichever comes
// first: a file system that does not answer at start (a dead or frozen mount: the
// MkdirAll, the key file, the root's descriptor never return) fails the open with
// ErrUnavailable at the deadline instead of hanging it. The open then goes on on its own
// goroutine until the kernel lets it, and the store it opens, if any, is closed: the
// caller never sees it (nor its warnings).
func openDirBounded(ctx context.Context, root string, opts options) (*dirStore, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	unavailable := func(err error) error {
		return &storage.OpError{Backend: "file", Where: filepath.Clean(root), Op: "open", Kind: storage.ErrUnavailable, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, unavailable(err)
	}
	var abandoned atomic.Bool
	warn := opts.OnWarning
	opts.OnWarning = func(err error) {
		switch {
		case abandoned.Load():
		case warn != nil:
			warn(err)
		default:
			fmt.Fprintln(os.Stderr, err)
		}
	}
	type opened struct {
		s   *dirStore
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := openDir(root, opts)
		done <- opened{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
	}
	abandoned.Store(true)
	go func() {
		if r := <-done; r.s != nil {
			r.s.Close()
		}
	}()
	return nil, unavailable(fmt.Errorf("the file system did not answer (the open is abandoned in the kernel): %w", ctx.Err()))
}

func openDir(root string, opts options) (*dirStore, error) {
	if g := openDirGate.Load(); g != nil {
		(*g)(root)
	}
	root = filepath.Clean(root)
	s := &dirStore{base: base{backend: "file", where: root, ns: opts.Namespace.ID(), opts: opts}}
	s.nsName = opts.Namespace.String()
	s.noWait.Store(true)
	s.nsDir = filepath.Join(root, s.nsName)
	fail := func(kind, err error) (*dirStore, error) {
		if s.fs != nil {
			s.fs.close()
		}
		return nil, &storage.OpError{Backend: "file", Where: root, Op: "open", Kind: kind, Err: err}
	}
	if fi, err := os.Stat(root); err == nil && !fi.IsDir() {
		return fail(storage.ErrBadArgument, errNotDir)
	}
	if err := os.MkdirAll(root, 0o750); err != nil {
		return fail(nil, err)
	}
	var err error
	if s.fs, err = openDirFS(root); err != nil {
		if err == errNotDir {
			return fail(storage.ErrBadArgument, err)
		}
		return fail(nil, err)
	}
	if fi, err := s.fs.root.Stat(); err == nil && fi.Mode().Perm()&0o022 != 0 {
		s.warn(&storage.OpError{Backend: "file", Where: root, Op: "open", Kind: storage.ErrWritableStore, Err: fmt.Errorf(
			"the store directory %s has mode %v: whoever can write it can delete pages (never forge them; links under it are not followed); chmod go-w %s",
			root, fi.Mode(), root)})
	}
	if err := unix.Mkdirat(s.fs.fd, s.nsName, 0o750); err != nil && err != unix.EEXIST {
		return fail(nil, &os.PathError{Op: "mkdir", Path: s.nsDir, Err: err})
	}
	if st, err := s.fs.lstat(s.nsName); err != nil {
		return fail(nil, &os.PathError{Op: "lstat", Path: s.nsDir, Err: err})
	} else if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		s.link("open", s.nsDir, linkSkipped+" (until a Clear replaces it)")
	} else if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fail(nil, &os.PathError{Op: "open", Path: s.nsDir, Err: syscall.ENOTDIR})
	}
	if s.opts.auth == nil {
		key, err := loadOrCreateKeyFile(filepath.Join(root, DirKeyFile), true)
		if err != nil {
			return fail(nil, err)
		}
		s.opts.auth = newMAC(key)
	}
	if s.cap, err = openCap(s); err != nil {
		return fail(capErrKind(err), err)
	}
	if s.cap != nil {
		s.fs.onClose = s.cap.close
	}
	return s, nil
}

// warn reports err to Options.OnWarning, or to stderr without one.
func (s *dirStore) warn(err error) {
	if s.opts.OnWarning != nil {
		s.opts.OnWarning(err)
		return
	}
	fmt.Fprintln(os.Stderr, err)
}

// What the store did with a link it found, for its report.
const (
	linkSkipped = "skipped, not followed"
	linkRemoved = "removed (the link itself, never its target)"
)

// link counts the symbolic link found at path by the call op and reports it, with what was
// done with it (linkSkipped, linkRemoved), the first few times.
func (s *dirStore) link(op, path, done string) {
	s.stats.links.Add(1)
	if s.warned.Add(1) <= maxLinkWarnings {
		s.warn(&storage.OpError{Backend: "file", Where: s.where, Op: op, Kind: storage.ErrLink,
			Err: fmt.Errorf("%s: %s", path, done)})
	}
}

// rel returns the path of key's page relative to the root, and the lengths of its
// directory part (<ns>/<xx>) and of the whole (one allocation).
func (s *dirStore) rel(k storage.Key) (rel string, dirLen int) {
	const hexLen = 2 * (storage.KeySize - storage.NamespaceSize)
	buf := make([]byte, 0, len(s.nsName)+4+hexLen)
	buf = append(buf, s.nsName...)
	buf = append(buf, '/')
	buf = hex.AppendEncode(buf, k[storage.NamespaceSize:storage.NamespaceSize+1])
	dirLen = len(buf)
	buf = append(buf, '/')
	buf = hex.AppendEncode(buf, k[storage.NamespaceSize:])
	return string(buf), dirLen
}

// path returns the fan-out directory and the file name of key, as absolute paths.
func (s *dirStore) path(k storage.Key) (dir, file string) {
	rel, dirLen := s.rel(k)
	return s.fs.abs(rel[:dirLen]), s.fs.abs(rel)
}

// openPage opens the page file rel for reading, without waiting and without following a
// link (as regfile.Open), and returns its descriptor and its fstat: the caller checks the
// file's type and closes it. A link on its path is reported as link, the entry that is one
// (rel itself when the page file is a link), with no descriptor. Raw descriptors, not
// os.File: a page read is four system calls (openat2, fstat, pread, close), as a plain read
// of the file, without the runtime poller's.
func (s *dirStore) openPage(rel string) (fd int, st unix.Stat_t, link string, err error) {
	fd, err = s.fs.open(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		if isLinkErr(err) {
			if l, found := s.fs.linkOn(rel); found {
				return -1, st, l, nil
			}
		}
		return -1, st, "", &fs.PathError{Op: "open", Path: s.fs.abs(rel), Err: err}
	}
	if err := fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, "", &fs.PathError{Op: "fstat", Path: s.fs.abs(rel), Err: err}
	}
	return fd, st, "", nil
}

// fileType names the type bits of a stat's mode as fs.FileMode prints them.
func fileType(mode uint32) fs.FileMode {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	case unix.S_IFREG:
		return 0
	}
	return fs.ModeIrregular
}

func fstat(fd int, st *unix.Stat_t) error {
	for {
		if err := unix.Fstat(fd, st); err != unix.EINTR {
			return err
		}
	}
}

// preadFull reads from fd at offset 0 into buf until buf is full or the file ends, and
// returns how much it read.
func preadFull(fd int, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], int64(n))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return n, err
		case m == 0:
			return n, nil
		}
		n += m
	}
	return n, nil
}

func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// Exists on the directory backend authenticates what it counts from the header alone and
// reads no payload: a value is present when its file is a regular file whose header is
// genuine for its key (header MAC) and whose size is that header's length plus the header,
// so that a torn, foreign or forged header, a link or a truncated file is absent (counted,
// reported and deleted, and the backup that asked rewrites it). The trade-off: a payload
// damaged in place behind a genuine header (a bit flip on the disk) counts as present until a
// Get reads it, rejects it and deletes it; the backup after that Get rewrites it. Verifying
// payloads here would make every backup read and MAC each page already stored (the MAC is
// the cost of a read: BenchmarkDataPath), to repair what a Get finds anyway, and no bad
// value is ever loaded either way.
func (s *dirStore) Exists(ctx context.Context, keys []storage.Key, present []bool) (int, error) {
	flags, ctx, cancel, err := s.beginLookup(ctx, "exists", keys, nil, present)
	if err != nil {
		return 0, err
	}
	defer cancel()
	if !s.fs.acquire() {
		return 0, s.err("exists", storage.ErrClosed, nil)
	}
	defer s.fs.release()
	err = forEach(ctx, len(keys), s.opts.Workers, present == nil, func(i int) (bool, error) {
		var ok bool
		var err error
		if derr := s.detach(ctx, "exists", func() { ok, err = s.existsOne(keys[i]) }, nil); derr != nil {
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

func (s *dirStore) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	return s.GetBound(ctx, keys, nil, dst, found)
}

func (s *dirStore) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if err := s.checkBinds("get", keys, binds); err != nil {
		return 0, err
	}
	dst = buffers(dst)
	flags, ctx, cancel, err := s.beginLookup(ctx, "get", keys, dst, found)
	if err != nil {
		return 0, err
	}
	defer cancel()
	if !s.fs.acquire() {
		return 0, s.err("get", storage.ErrClosed, nil)
	}
	defer s.fs.release()
	err = forEach(ctx, len(keys), s.opts.Workers, found == nil, func(i int) (bool, error) {
		ok, err := s.getOne(ctx, keys[i], bindAt(binds, i), dst[i])
		if ok {
			s.stats.hits.Add(1)
			s.stats.bytesRead.Add(uint64(len(dst[i])))
		}
		flags[i] = ok
		return ok, err
	})
	if err != nil {
		return leading(flags), s.err("get", kindOf(ctx, err), err)
	}
	return leading(flags), nil
}

// getOne reads k's page into dst and verifies it, on as many cores as Get has workers.
//
// The open (and its fstat) is detached, as every file system operation that can block in
// the kernel (detach.go). The read then goes straight into place: one preadv2 of the
// header into a small buffer and of the payload into dst, with RWF_NOWAIT, which the
// kernel serves only from the page cache and refuses (EAGAIN) rather than wait for the
// disk or a lock; made by this call, it cannot outlive it. The payload is verified there,
// in dst, while the kernel's copy is still in cache: each byte is touched once after the
// read. A page that is not cached (or a file system without RWF_NOWAIT, or a file of
// another size: an older format's, a torn one) is read as before: by a detached pread into
// a private buffer, verified there and copied into dst in the same pass, so that a read
// abandoned at the deadline never writes into dst (its caller reuses it once Get returned).
// Either way a value that fails verification is a miss; dst's contents are then
// unspecified (the Storage contract: the cache publishes only pages found).
func (s *dirStore) getOne(ctx context.Context, k storage.Key, bind *storage.Binding, dst []byte) (bool, error) {
	rel, _ := s.rel(k)
	var (
		fd      = -1
		st      unix.Stat_t
		link    string
		err     error
		expired bool // past the TTL: a miss (readOpened's)
	)
	if derr := s.detach(ctx, "get", func() {
		fd, st, link, err = s.openPage(rel)
		if err == nil && link == "" && s.cap != nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			if expired = s.cap.expired(&st); !expired {
				// A use, for the eviction's order and the TTL, recorded with the open so
				// that whatever comes after this Get sees it (st keeps the time before it).
				s.cap.touch(fd)
			}
		}
	}, func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}); derr != nil {
		return false, derr
	}
	if err == nil && link == "" && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == int64(storage.StoredLen(len(dst))) && !expired && s.noWait.Load() {
		var hdr [storage.HeaderSize]byte
		n, rerr := preadNoWait(fd, hdr[:], dst)
		switch {
		case rerr == nil && n == len(hdr)+len(dst):
			closeLater(fd)
			s.inPlace.Add(1)
			f := pageFile{mode: unix.S_IFREG, size: st.Size, n: len(hdr)}
			return s.loadPage(k, bind, rel, f, hdr[:], dst, true)
		case rerr == unix.EOPNOTSUPP || rerr == unix.EINVAL || rerr == unix.ENOSYS:
			s.noWait.Store(false) // the file system reads no page without waiting: never again
		}
		// Not all cached (EAGAIN, a short read): read it the other way, from the start.
	}
	buf := getBuffer(storage.StoredLen(len(dst)))
	var f pageFile
	if derr := s.detach(ctx, "get", func() { f, err = s.readOpened(rel, fd, st, link, err, *buf) }, func() { putBuffer(buf) }); derr != nil {
		return false, derr
	}
	ok := false
	if err == nil {
		ok, err = s.loadPage(k, bind, rel, f, (*buf)[:f.n], dst, false)
	}
	putBuffer(buf)
	return ok, err
}

// preadNoWait reads the file fd from offset 0 into hdr then payload with one preadv2
// that takes only what the page cache holds (RWF_NOWAIT). It makes the system call
// without the race detector's annotations of unix.Preadv2 (which reports the kernel's
// writes as the caller's: correct, and here the caller's own goroutine).
func preadNoWait(fd int, hdr, payload []byte) (int, error) {
	iov := [2]unix.Iovec{{Base: &hdr[0]}, {Base: unsafe.SliceData(payload)}}
	iov[0].SetLen(len(hdr))
	iov[1].SetLen(len(payload))
	for {
		n, _, errno := unix.Syscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), 0, 0, unix.RWF_NOWAIT)
		runtime.KeepAlive(hdr)
		runtime.KeepAlive(payload)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
}

// closeLater closes fd, a page file opened for reading, on the closer goroutine: a close
// can block in the kernel too (FUSE sends a flush), and Get does not wait for it. When the
// closer is behind (a file system that stopped answering), the close runs on a goroutine
// of its own.
func closeLater(fd int) {
	closerOnce.Do(func() {
		go func() {
			for fd := range closing {
				unix.Close(fd)
			}
		}()
	})
	select {
	case closing <- fd:
	default:
		go unix.Close(fd)
	}
}

var (
	closing    = make(chan int, 1024)
	closerOnce sync.Once
)

// existsOne reports whether k holds a value whose header is genuine (its MAC verifies for
// this key) and whose length matches the file's size, reading the header only (see
// Exists). A value that fails is corrupt (counted, reported, purged), so the next backup of
// the page replaces it.
func (s *dirStore) existsOne(k storage.Key) (bool, error) {
	rel, _ := s.rel(k)
	fd, st, link, err := s.openPage(rel)
	if err != nil {
		if isMissing(err) {
			return false, nil
		}
		return false, err
	}
	if link != "" {
		s.linkedPage("exists", k, rel, link)
		return false, nil
	}
	defer unix.Close(fd)
	name := s.fs.abs(rel)
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			s.corruptIn("exists", k, fmt.Errorf("file %s: not a regular file (%v)", name, fileType(st.Mode)))
		}
		return false, nil
	}
	if s.cap != nil && s.cap.expired(&st) {
		return false, nil // past the TTL: absent, removed by the next sweep
	}
	var hdr [storage.HeaderSize]byte
	n, err := preadFull(fd, hdr[:])
	if err != nil {
		return false, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	hs := storage.HeaderLen(hdr[:n]) // a header of any format version read
	if n < 6 {
		s.corruptIn("exists", k, fmt.Errorf("file %s: truncated header", name))
		return false, nil
	}
	if err := s.checkHeader(hdr[:min(hs, n)], k, nil, int(st.Size-int64(hs))); err != nil {
		s.corruptIn("exists", k, fmt.Errorf("file %s: %w", name, err))
		return false, nil
	}
	return true, nil
}

// detach is base.detach for an operation under the store's directory: the operation holds
// the root's descriptor open (dirFS.acquire) until it returns, also after its call
// abandoned it, so a late operation never acts through a descriptor number that a Close
// freed and the process reused for another directory.
func (s *dirStore) detach(ctx context.Context, op string, fn func(), late func()) error {
	if !s.fs.acquire() {
		return storage.ErrClosed
	}
	err := s.base.detach(ctx, op, fn, func() {
		s.fs.release()
		if late != nil {
			late()
		}
	})
	if err == nil {
		s.fs.release()
	}
	return err
}

// pageFile is what readPage found under a page's name.
type pageFile struct {
	missing bool   // no such file
	link    string // the entry on the way that is a symbolic link (not followed)
	mode    uint32 // the file's type bits (unix.S_IFMT)
	size    int64  // and its size
	n       int    // bytes read into the buffer, from the start of the file
}

// readOpened reads the page file rel, which openPage opened (fd, st, link, err: what it
// returned), into buf (header and payload: storage.StoredLen bytes, room for a value of
// any format read): one pread, as a plain read of the file, of at most buf's length, and
// closes it. It reads nothing when the file is not a regular one. It makes system calls
// only (it is the detached part of a Get): loadPage judges what it found.
func (s *dirStore) readOpened(rel string, fd int, st unix.Stat_t, link string, err error, buf []byte) (f pageFile, _ error) {
	if err != nil {
		if isMissing(err) {
			return pageFile{missing: true}, nil
		}
		return f, err
	}
	if link != "" {
		return pageFile{link: link}, nil
	}
	defer unix.Close(fd)
	f.mode, f.size = st.Mode&unix.S_IFMT, st.Size
	if f.mode != unix.S_IFREG {
		return f, nil
	}
	if s.cap != nil && s.cap.expired(&st) {
		return pageFile{missing: true}, nil // past the TTL: a miss, removed by the next sweep
	}
	if f.size < int64(len(buf)) {
		buf = buf[:f.size]
	}
	if f.n, err = preadFull(fd, buf); err != nil {
		return f, &fs.PathError{Op: "read", Path: s.fs.abs(rel), Err: err}
	}
	return f, nil
}

// loadPage verifies what getOne found for key k (rel; bind: see GetBound) and read into v
// (f.n bytes: the whole value, or with inPlace its header only, its payload read into dst
// already), and copies its payload into dst. A missing, foreign, torn or corrupt file is (false, nil),
// counted; a hit is counted by Get. The value's header may be of any format version read
// (storage.HeaderLen).
func (s *dirStore) loadPage(k storage.Key, bind *storage.Binding, rel string, f pageFile, v, dst []byte, inPlace bool) (bool, error) {
	name := s.fs.abs(rel)
	switch {
	case f.missing:
		s.stats.misses.Add(1)
		return false, nil
	case f.link != "":
		if !s.linkedPage("get", k, rel, f.link) {
			s.stats.misses.Add(1)
		}
		return false, nil
	case f.mode == unix.S_IFDIR: // the store's layout is broken: an I/O error, as reading it is
		return false, &fs.PathError{Op: "read", Path: name, Err: syscall.EISDIR}
	case f.mode != unix.S_IFREG:
		s.corrupt(k, fmt.Errorf("file %s: not a regular file (%v)", name, fileType(f.mode)))
		return false, nil
	}
	hs := storage.HeaderLen(v)
	want := hs + len(dst)
	var reason error
	switch {
	case len(v) < 6:
		reason = fmt.Errorf("file %s: truncated header", name)
	default:
		// A header shorter than its version's is refused by checkHeader, after its
		// version: an older format's short file is old, not torn.
		if err := s.checkHeader(v[:min(hs, len(v))], k, bind, len(dst)); err != nil {
			reason = fmt.Errorf("file %s: %w", name, err)
		} else if f.size < int64(want) || !inPlace && len(v) < want {
			reason = fmt.Errorf("file %s: truncated payload", name)
		} else if f.size > int64(want) {
			reason = fmt.Errorf("file %s: longer than header+payload", name)
		} else if inPlace {
			if err := s.opts.auth.CheckPayload(v[:hs], dst); err != nil {
				reason = fmt.Errorf("file %s: %w", name, err)
			}
		} else if err := s.opts.auth.CheckPayloadCopy(v[:hs], v[hs:want], dst); err != nil {
			reason = fmt.Errorf("file %s: %w", name, err)
		}
	}
	if reason != nil {
		s.corrupt(k, reason)
		return false, nil
	}
	return true, nil
}

// linkedPage handles a read of k's page (rel) that met the link at link: it is counted and
// reported; a page file that is itself a link is also corrupt (and purged: the link is
// removed, never its target). It reports whether it counted the page corrupt.
func (s *dirStore) linkedPage(op string, k storage.Key, rel, link string) bool {
	if link != rel {
		s.link(op, s.fs.abs(link), linkSkipped)
		return false
	}
	s.link(op, s.fs.abs(link), "not followed; purged as a corrupt page (the link itself, never its target)")
	s.corruptIn(op, k, fmt.Errorf("file %s: a symbolic link, not followed", s.fs.abs(rel)))
	return true
}

func (s *dirStore) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	return s.PutBound(ctx, keys, nil, src)
}

func (s *dirStore) PutBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, src [][]byte) error {
	if err := s.checkBinds("put", keys, binds); err != nil {
		return err
	}
	src = buffers(src)
	ctx, cancel, err := s.beginCall(ctx, "put", keys, src, nil)
	if err != nil {
		return err
	}
	defer cancel()
	if !s.fs.acquire() {
		return s.err("put", storage.ErrClosed, nil)
	}
	defer s.fs.release()
	if s.cap != nil && len(keys) > 0 {
		// Room for the batch before it is written (dircap.go).
		var n int64
		for _, p := range src {
			n += int64(storage.StoredLen(len(p)))
		}
		if err := s.reserve(ctx, n); err != nil {
			return s.err("put", kindOf(ctx, err), err)
		}
	}
	err = forEach(ctx, len(keys), s.opts.Workers, false, func(i int) (bool, error) {
		// The value is encoded here, on as many cores as there are workers: the payload
		// copied into a buffer of the write's own block by block, each block checksummed
		// while in cache, then MAC'd (encodeValue). The file is written from that copy, in
		// one write (detached, see detach): an abandoned write never reads src[i], which
		// the caller reuses once Put returned. The copy is the price of that promise, a
		// few percent of a Put's CPU (a memcpy from cache, against the MAC and the
		// kernel's copy into the page cache: BenchmarkDataPath).
		buf := getBuffer(storage.StoredLen(len(src[i])))
		bind := bindAt(binds, i)
		s.encodeValue(*buf, keys[i], bind, src[i])
		var err error
		if derr := s.detach(ctx, "put", func() { err = s.putOne(ctx, keys[i], bind, *buf) }, func() { putBuffer(buf) }); derr != nil {
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

// putOne writes one page's value (header and payload, encoded: encodeValue). A Clear of the namespace that runs meanwhile (another instance's
// flush) may move the fan-out directory aside, the temporary file with it, or remove it,
// before the file is created or renamed: the page was then put concurrently with the Clear,
// and is cleared by it (as if written just before it), not an error.
func (s *dirStore) putOne(ctx context.Context, k storage.Key, bind *storage.Binding, value []byte) (err error) {
	payload := value[storage.HeaderSize:]
	rel, dirLen := s.rel(k)
	dirRel, file := rel[:dirLen], rel[dirLen+1:]
	dir, err := s.fanOut(dirRel)
	switch {
	case err == errLinked:
		return nil // counted and reported by fanOut
	case err == errCleared:
		return s.clearedPut(payload)
	case err != nil:
		return err
	}
	defer unix.Close(dir)
	s.reapOnce(ctx, dir, dirRel, k[storage.NamespaceSize])
	tmp, fd, err := createTemp(dir)
	if err == unix.ENOENT { // the directory was removed with a Clear's trash
		return s.clearedPut(payload)
	}
	if err != nil {
		return &fs.PathError{Op: "create", Path: s.fs.abs(dirRel) + "/.tmp-*", Err: err}
	}
	f := os.NewFile(uintptr(fd), s.fs.abs(dirRel+"/"+tmp))
	defer func() {
		if err != nil {
			f.Close()
			unix.Unlinkat(dir, tmp, 0)
		}
	}()
	if _, err = f.Write(value); err != nil {
		return err
	}
	if s.opts.Fsync {
		if err = f.Sync(); err != nil {
			return err
		}
	}
	if s.cap != nil {
		s.cap.touch(fd) // a use, to the clock's precision (a write's mtime is the kernel's coarse time)
		s.cap.remember(k, bind)
	}
	if err = f.Close(); err != nil {
		return err
	}
	// renameat replaces whatever entry has the page's name, a link included, never what a
	// link points to.
	if err = renameat(dir, tmp, file); err != nil {
		if err == unix.ENOENT { // gone with its directory
			err = nil
			return s.clearedPut(payload)
		}
		return &fs.PathError{Op: "rename", Path: s.fs.abs(rel), Err: err}
	}
	if s.opts.Fsync {
		if err = fsync(dir); err != nil {
			if err == unix.ENOENT {
				err = nil
				return s.clearedPut(payload)
			}
			return &fs.PathError{Op: "fsync", Path: s.fs.abs(dirRel), Err: err}
		}
	}
	s.stats.puts.Add(1)
	s.stats.bytesWritten.Add(uint64(len(payload)))
	return nil
}

var (
	errLinked  = errors.New("a link on the path")       // fanOut: the put is skipped
	errCleared = errors.New("cleared while being made") // fanOut: the put is cleared
)

// fanOut opens the fan-out directory dirRel (<ns>/<xx>), making it and the namespace
// directory if they are missing. A link on the way is counted and reported, and errLinked
// returned: the put is skipped. A Clear that keeps moving the namespace aside while it is
// made is errCleared.
func (s *dirStore) fanOut(dirRel string) (int, error) {
	for range 3 {
		fd, err := s.fs.openDir(dirRel)
		if err == nil {
			return fd, nil
		}
		if isLinkErr(err) {
			if l, ok := s.fs.linkOn(dirRel); ok {
				s.link("put", s.fs.abs(l), linkSkipped)
				return -1, errLinked
			}
		}
		if err != unix.ENOENT {
			return -1, &fs.PathError{Op: "open", Path: s.fs.abs(dirRel), Err: err}
		}
		if err := unix.Mkdirat(s.fs.fd, s.nsName, 0o750); err != nil && err != unix.EEXIST {
			return -1, &fs.PathError{Op: "mkdir", Path: s.nsDir, Err: err}
		}
		ns, err := s.fs.openDir(s.nsName)
		if err != nil {
			continue // moved aside again, or a link: the next open says which
		}
		err = unix.Mkdirat(ns, dirRel[len(s.nsName)+1:], 0o750)
		unix.Close(ns)
		if err != nil && err != unix.EEXIST && err != unix.ENOENT {
			return -1, &fs.PathError{Op: "mkdir", Path: s.fs.abs(dirRel), Err: err}
		}
	}
	return -1, errCleared
}

// reapOnce removes, the first time this store writes into fan-out directory dir, the
// temporary files there older than TempMaxAge: a dead writer's (see dirStore). It is best
// effort and bounded by ctx.
func (s *dirStore) reapOnce(ctx context.Context, dir int, dirRel string, fan byte) {
	if s.reaped[fan].Load() || !s.reaped[fan].CompareAndSwap(false, true) {
		return
	}
	readNames(dir, s.fs.abs(dirRel), func(name string, typ uint32) (bool, error) {
		if ctx.Err() != nil {
			return false, nil
		}
		if !strings.HasPrefix(name, ".tmp-") {
			return true, nil
		}
		var st unix.Stat_t
		if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR &&
			time.Since(time.Unix(st.Mtim.Unix())) > TempMaxAge {
			unix.Unlinkat(dir, name, 0)
		}
		return true, nil
	})
}

// createTemp creates a new temporary file .tmp-<random> in dir (mode 0600) for writing.
func createTemp(dir int) (string, int, error) {
	for {
		name := fmt.Sprintf(".tmp-%016x", rand.Uint64())
		fd, err := openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != unix.EEXIST {
			return name, fd, err
		}
	}
}

func renameat(dir int, from, to string) error { return renameBetween(dir, from, dir, to) }

// renameBetween renames from in directory fromDir to to in toDir, again when interrupted.
func renameBetween(fromDir int, from string, toDir int, to string) error {
	for {
		if err := unix.Renameat(fromDir, from, toDir, to); err != unix.EINTR {
			return err
		}
	}
}

func fsync(fd int) error {
	for {
		if err := unix.Fsync(fd); err != unix.EINTR {
			return err
		}
	}
}

// clearedPut counts a put that a concurrent Clear removed with the namespace (putOne).
func (s *dirStore) clearedPut(payload []byte) error {
	s.stats.puts.Add(1)
	s.stats.bytesWritten.Add(uint64(len(payload)))
	return nil
}

func (s *dirStore) Delete(ctx context.Context, keys []storage.Key) error {
	ctx, cancel, err := s.beginCall(ctx, "delete", keys, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	if !s.fs.acquire() {
		return s.err("delete", storage.ErrClosed, nil)
	}
	defer s.fs.release()
	err = forEach(ctx, len(keys), s.opts.Workers, false, func(i int) (bool, error) {
		var err error
		if derr := s.detach(ctx, "delete", func() {
			if err = s.deleteOne(keys[i]); err == nil {
				s.stats.deletes.Add(1)
			}
		}, nil); derr != nil {
			return false, derr
		}
		return err == nil, err
	})
	if err != nil {
		return s.err("delete", kindOf(ctx, err), err)
	}
	return nil
}

// deleteOne removes k's page entry (a link is removed itself). Through a fan-out or
// namespace directory that is a link it removes nothing (the link is reported).
func (s *dirStore) deleteOne(k storage.Key) error {
	rel, dirLen := s.rel(k)
	dir, err := s.fs.openDir(rel[:dirLen])
	if err != nil {
		if isLinkErr(err) {
			if l, ok := s.fs.linkOn(rel[:dirLen]); ok {
				s.link("delete", s.fs.abs(l), linkSkipped)
				return nil
			}
		}
		if isMissing(err) {
			return nil
		}
		return &fs.PathError{Op: "open", Path: s.fs.abs(rel[:dirLen]), Err: err}
	}
	defer unix.Close(dir)
	if s.cap != nil {
		s.cap.replaced(dir, rel[dirLen+1:])
	}
	err = unix.Unlinkat(dir, rel[dirLen+1:], 0)
	if err == unix.EISDIR || err == unix.EPERM { // a directory under a page's name, as os.Remove
		err = unix.Unlinkat(dir, rel[dirLen+1:], unix.AT_REMOVEDIR)
	}
	if err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "remove", Path: s.fs.abs(rel), Err: err}
	}
	return nil
}

// Clear moves the namespace directory aside (one atomic rename, so no reader sees half of
// it) and removes it, with what earlier Clears left aside (one that crashed, or ran out of
// time). Removal is bounded by the call's deadline: the namespace is clear once it is moved
// aside, and what is left of the trash then goes with the next Clear. Other namespaces
// under the same root are untouched. Nothing is removed through a link: a namespace, trash
// or fan-out entry that is a link is removed itself (and reported).
func (s *dirStore) Clear(ctx context.Context) error {
	ctx, cancel, err := s.beginCall(ctx, "clear", nil, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	if err := ctx.Err(); err != nil {
		return s.err("clear", storage.ErrUnavailable, err)
	}
	if !s.fs.acquire() {
		return s.err("clear", storage.ErrClosed, nil)
	}
	defer s.fs.release()
	// One detached operation (see detach): abandoned at the deadline, its removal of the
	// trash stops at its next check of ctx, which ends with the call.
	if derr := s.detach(ctx, "clear", func() { err = s.clear(ctx) }, nil); derr != nil {
		return s.err("clear", kindOf(ctx, derr), derr)
	}
	return err
}

// clear is Clear's work, in the call's context.
func (s *dirStore) clear(ctx context.Context) error {
	root := s.fs.fd
	trashPrefix := ".trash-" + s.nsName + "-"
	trash, err := s.fs.mkdirTemp(trashPrefix)
	if err != nil {
		return s.err("clear", nil, err)
	}
	into, err := s.fs.openDir(trash)
	if err == nil {
		// renameat moves the entry, whatever it is (a link included), never its target.
		err = renameBetween(root, s.nsName, into, "ns")
		unix.Close(into)
	}
	if err != nil && err != unix.ENOENT {
		unix.Unlinkat(root, trash, unix.AT_REMOVEDIR)
		return s.err("clear", nil, &fs.PathError{Op: "rename", Path: s.nsDir, Err: err})
	}
	if err := unix.Mkdirat(root, s.nsName, 0o750); err != nil && err != unix.EEXIST {
		return s.err("clear", nil, &fs.PathError{Op: "mkdir", Path: s.nsDir, Err: err})
	}
	// The namespace is empty: remove the trash (a concurrent Clear may be removing the
	// same; both succeed). Another Clear's trash is removed only once its namespace is in
	// it: removed between its mkdir and its rename, that Clear's rename would fail as if
	// the namespace were missing, and it would report success having cleared nothing.
	var old []string
	if err := readNames(root, s.where, func(name string, _ uint32) (bool, error) {
		if strings.HasPrefix(name, trashPrefix) {
			old = append(old, name)
		}
		return true, nil
	}); err != nil {
		return s.err("clear", nil, err)
	}
	for _, name := range old {
		st, err := s.fs.lstat(name)
		switch {
		case err != nil:
			continue
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			s.link("clear", s.fs.abs(name), linkRemoved)
			unix.Unlinkat(root, name, 0)
			continue
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			continue
		}
		if name != trash {
			if _, err := s.fs.lstat(name + "/ns"); err != nil {
				// No namespace in it: a Clear between its mkdir and its rename (leave it),
				// or one that died there; that one's empty trash goes once older than
				// TempMaxAge (rmdir: only while it is still empty).
				if err == unix.ENOENT && time.Since(time.Unix(st.Mtim.Unix())) > TempMaxAge {
					unix.Unlinkat(root, name, unix.AT_REMOVEDIR)
				}
				continue
			}
		}
		removedLink := func(path string) { s.link("clear", path, linkRemoved) }
		if err := removeAll(ctx, root, name, s.fs.abs(name), 0, removedLink); err != nil {
			if ctx.Err() != nil {
				return nil // cleared; the rest of the trash goes with the next Clear
			}
			return s.err("clear", nil, err)
		}
	}
	return nil
}

// Close is nil-safe and idempotent; the root's handle is closed once no call uses it.
func (s *dirStore) Close() error {
	if s == nil {
		return nil
	}
	s.closed.Store(true)
	s.fs.close()
	return nil
}

// kindOf classifies an error of a file operation: the context ending is ErrUnavailable
// (the call did not finish in time), as is a call refused because too many file system
// operations are stuck (ErrStuck) or a Put past the capacity whose eviction scan did not
// finish in time (dircap.go); anything else (permissions, a full disk) has no kind.
func kindOf(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) ||
		errors.Is(err, storage.ErrStuck) || errors.Is(err, errScanCut) {
		return storage.ErrUnavailable
	}
	return nil
}
