package stores

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/storage"
)

// The capacity of a directory store (Options.MaxBytes, URL max_bytes=) and its TTL
// (Options.TTL, URL ttl=).
//
// What is counted: the bytes of page files (header + payload, their apparent size) and of
// writes in progress (.tmp-*) under the root, over every namespace. du adds the file
// system's block rounding and the directories.
//
// Shared accounting: every store that opens the root with a capacity, in any process, keeps
// one counter in <root>/.cpcache-usage (the bytes used, and when the last eviction scan
// ended), read and written under an exclusive flock of that file. A Put reserves its batch's
// bytes there before it writes; a Delete gives its bytes back at the store's next
// reservation. A Put over a stored page counts its bytes again (no stat of the old file per
// Put: the cache's backups skip pages already stored), an over-count that the next scan
// corrects. A reservation that takes the counter past the high watermark
// (highWater of the capacity) makes that Put evict: it takes the eviction lock (flock of
// <root>/.cpcache-evict, so one store of all scans at a time), re-reads the counter, scans
// the root, removes pages down to the low watermark (lowWater of the capacity) and sets the
// counter to what it measured, plus what other stores reserved meanwhile. A Put whose
// reservation takes the counter past the capacity itself waits for a running eviction (of
// any process) and evicts after it if still needed; a Put below that does not wait for
// another store's eviction. A flock dies with its process, so a killed store never blocks
// the others; every lock wait polls (never blocks in the kernel) and ends with the call's
// context, and the scan, the counter's reads and writes run as detached operations
// (detach.go), so a frozen file system fails the Put at its deadline, never hangs it. The
// counter is corrected by every scan: pages removed by a Clear, a crashed writer's
// reservation or a store opened without a capacity are found there.
//
// Overshoot: a scan counts the pages and writes in progress it sees; a Put that reserved its
// bytes before a scan began and had not created its file when the scan listed the directory
// is not seen, so the directory may exceed the capacity by at most the Put batches in flight
// while a scan lists it (one batch per writing store: a backup batch of each rank).
//
// Which pages go: least recently used first, where a use is a Put or a Get that hits (which
// sets the file's atime to the time of the call: one futimens per hit; the last use is the
// later of atime and mtime). A chain's later pages go before its earlier ones: the scan reads
// each page's parent id from its header (once per page and store; storage.PeekParent), finds
// the parent page by its key (storage.PageKeyIn, over the tensor-parallel shards it has seen,
// up to maxShardGuess), and ranks a page by the most recent use of it or of any page after it
// in its chain (reading a page reads its prefix, so a prefix is never older than what follows
// it), deeper pages first among equals. A page whose prefix is gone can never be read, so a
// page never goes before its descendants. Pages of other namespaces under the root are
// ranked the same way: the capacity is the directory's.
//
// TTL: a page whose last use is older than the TTL is a miss (Get, Exists) and is removed by
// the next scan; a Put runs a scan when none ran for sweepEvery(TTL).
//
// A scan has half of its Put's remaining time. A Put within the capacity whose scan is cut
// goes on and writes (the next Put scans again, with the headers this one read); one past
// the capacity fails (ErrUnavailable). A store opened on a directory that holds no counter
// yet (a new one, or one filled without a capacity) scans at its first Put.

const (
	usageFileName = ".cpcache-usage"
	evictFileName = ".cpcache-evict"
	// highWater and lowWater are the eviction's watermarks, in thousandths of the capacity:
	// a Put that takes the usage past highWater evicts down to lowWater.
	highWater = 950
	lowWater  = 850
	// maxShardGuess bounds the tensor-parallel shards the scan tries to find a page's parent
	// key (storage.PageKeyIn) beyond those it has already matched.
	maxShardGuess = 16
	// usageSize is the counter's record: bytes used, end of the last scan (Unix ns).
	usageSize = 16
)

// dirCap is a directory store's capacity and TTL, and its view of the shared accounting.
type dirCap struct {
	max, high, low int64         // bytes; 0: no capacity (a TTL alone)
	ttl            time.Duration // 0: none
	usageFD        int           // <root>/.cpcache-usage
	evictFD        int           // <root>/.cpcache-evict
	// freed: bytes this store removed (Delete) or did not write (a failed Put) since its
	// last reservation, given back with the next one.
	freed atomic.Int64

	mu      sync.Mutex                    // protects parents and shards
	parents map[storage.Key]*parentInfo   // what the scans know of each page's parent
	shards  []uint32                      // shards whose keys matched a parent, most recent first
	now     func() time.Time              // the clock (tests)
	scanned atomic.Pointer[capScanResult] // the last scan (tests)
}

// capScanResult is what one eviction scan found and did.
type capScanResult struct {
	Pages, Bytes, TempBytes int64 // measured before eviction
	Evicted, Expired        int64 // pages removed
	EvictedBytes            int64
}

// parseBytes parses a byte count: a positive integer with an optional unit, B, kB/KB, MB,
// GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive; K, M,
// G, T alone are powers of 1024.
func parseBytes(v string) (int64, error) {
	s := strings.TrimSpace(v)
	i := len(s)
	for i > 0 && (s[i-1] < '0' || s[i-1] > '9') {
		i--
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult := map[string]int64{"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "kb": 1e3, "m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
		"g": 1 << 30, "gib": 1 << 30, "gb": 1e9, "t": 1 << 40, "tib": 1 << 40, "tb": 1e12}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("unknown unit %q (want B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)", s[i:])
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("not a positive byte count (like 536870912, 512MiB or 2GiB)")
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("more than %d bytes", int64(math.MaxInt64))
	}
	return n * mult, nil
}

// sweepEvery is how often Puts scan a store with TTL ttl for expired pages.
func sweepEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/2, 100*time.Millisecond), time.Minute)
}

// openCap opens the shared accounting of s's root when opts ask for a capacity or a TTL
// (nil otherwise). The files are opened relative to the root without following links.
func openCap(s *dirStore) (*dirCap, error) {
	o := s.opts
	if o.MaxBytes < 0 {
		return nil, &storage.OpError{Backend: "file", Where: s.where, Op: "open", Kind: storage.ErrBadArgument,
			Err: fmt.Errorf("MaxBytes %d is negative (0: no capacity)", o.MaxBytes)}
	}
	if o.MaxBytes == 0 && o.TTL <= 0 {
		return nil, nil
	}
	c := &dirCap{max: o.MaxBytes, ttl: max(o.TTL, 0), usageFD: -1, evictFD: -1,
		parents: map[storage.Key]*parentInfo{}, now: time.Now}
	c.watermarks()
	var err error
	for _, f := range []struct {
		name string
		fd   *int
	}{{usageFileName, &c.usageFD}, {evictFileName, &c.evictFD}} {
		if *f.fd, err = s.fs.open(f.name, unix.O_RDWR|unix.O_CREAT, 0o600); err != nil {
			c.close()
			return nil, &fs.PathError{Op: "open", Path: s.fs.abs(f.name), Err: err}
		}
	}
	return c, nil
}

// watermarks sets the eviction's watermarks from the capacity, and returns c.
func (c *dirCap) watermarks() *dirCap {
	if c.max < math.MaxInt64/1000 {
		c.high, c.low = c.max*highWater/1000, c.max*lowWater/1000
	} else {
		c.high, c.low = c.max/1000*highWater, c.max/1000*lowWater
	}
	return c
}

// capErrKind is the kind of an error of openCap: ErrBadArgument for a bad option.
func capErrKind(err error) error {
	var oe *storage.OpError
	if errors.As(err, &oe) {
		return oe.Kind
	}
	return nil
}

// close closes the accounting files; idempotent.
func (c *dirCap) close() {
	for _, fd := range []*int{&c.usageFD, &c.evictFD} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// lockFile takes flock how (LOCK_EX) on fd, polling without blocking in the kernel until
// ctx is done.
func lockFile(ctx context.Context, fd, how int) error {
	wait := 50 * time.Microsecond
	for {
		err := unix.Flock(fd, how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
}

func unlockFile(fd int) { unix.Flock(fd, unix.LOCK_UN) }

// usage is the shared counter's record.
type usage struct {
	used     int64 // bytes
	lastScan int64 // Unix ns; 0: never (the counter is unknown)
}

func (c *dirCap) readUsage() (usage, error) {
	var b [usageSize]byte
	n, err := preadFull(c.usageFD, b[:])
	if err != nil || n < usageSize {
		return usage{}, err
	}
	return usage{int64(binary.LittleEndian.Uint64(b[0:])), int64(binary.LittleEndian.Uint64(b[8:]))}, nil
}

func (c *dirCap) writeUsage(u usage) error {
	var b [usageSize]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(max(u.used, 0)))
	binary.LittleEndian.PutUint64(b[8:], uint64(u.lastScan))
	for {
		_, err := unix.Pwrite(c.usageFD, b[:], 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// update adds delta bytes (less what this store freed since) to the shared counter under
// its lock, and returns the counter after it.
func (c *dirCap) update(ctx context.Context, delta int64, set func(*usage)) (usage, error) {
	if err := lockFile(ctx, c.usageFD, unix.LOCK_EX); err != nil {
		return usage{}, err
	}
	defer unlockFile(c.usageFD)
	u, err := c.readUsage()
	if err != nil {
		return u, err
	}
	freed := c.freed.Swap(0)
	u.used = max(u.used+delta-freed, 0)
	if set != nil {
		set(&u)
	}
	if err := c.writeUsage(u); err != nil {
		c.freed.Add(freed)
		return u, err
	}
	return u, nil
}

// due reports whether u calls for a scan: the counter is unknown, past the high watermark,
// or a TTL's sweep is due.
func (c *dirCap) due(u usage) bool {
	return u.lastScan == 0 || c.max > 0 && u.used > c.high ||
		c.ttl > 0 && c.now().UnixNano()-u.lastScan > int64(sweepEvery(c.ttl))
}

// reserve is the capacity's part of a Put of n bytes (capacity or TTL set): it reserves
// them in the shared counter and evicts when the counter asks for it (see the top of this
// file). It returns an error only when the call's context ended or the accounting failed.
func (s *dirStore) reserve(ctx context.Context, n int64) error {
	c := s.cap
	var u usage
	var err error
	if derr := s.detach(ctx, "put", func() { u, err = c.update(ctx, n, nil) }, nil); derr != nil {
		// Abandoned, the reservation may still be made when the kernel returns: it is
		// not given back (an over-count, which the next scan corrects; an under-count
		// would let the directory grow past its capacity).
		return derr
	}
	if err != nil {
		return &fs.PathError{Op: "update", Path: s.fs.abs(usageFileName), Err: err}
	}
	if !c.due(u) {
		return nil
	}
	wait := c.max > 0 && u.used > c.max
	if derr := s.detach(ctx, "evict", func() { err = s.evict(ctx, wait, n) }, nil); derr != nil {
		c.freed.Add(n) // the batch is not written: its reservation goes back with the next one
		return derr
	}
	if err != nil {
		c.freed.Add(n)
	}
	return err
}

// evict takes the eviction lock (waiting for another store's scan, bounded by ctx, when
// wait is set; else leaving it to that store), and scans if the counter still asks for it.
// pending is what the calling Put reserved and has not written yet: the scan makes room for
// it too.
func (s *dirStore) evict(ctx context.Context, wait bool, pending int64) error {
	c := s.cap
	if wait {
		if err := lockFile(ctx, c.evictFD, unix.LOCK_EX); err != nil {
			return err
		}
	} else if err := unix.Flock(c.evictFD, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if err == unix.EWOULDBLOCK || err == unix.EINTR {
			return nil // another store is scanning
		}
		return &fs.PathError{Op: "flock", Path: s.fs.abs(evictFileName), Err: err}
	}
	defer unlockFile(c.evictFD)
	before, err := c.update(ctx, 0, nil)
	if err != nil {
		return &fs.PathError{Op: "update", Path: s.fs.abs(usageFileName), Err: err}
	}
	if !c.due(before) || wait && before.used <= c.max && before.lastScan != 0 {
		return nil // the scan that held the lock made room (for this Put, if not to the low watermark)
	}
	// The scan has half of the call's time left: a Put that need not wait for room still
	// has time to write when its scan is cut (the next Put scans again; each scan reads
	// only the headers the earlier ones did not).
	scanCtx, cancel := ctx, context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); ok {
		scanCtx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
	}
	res, err := s.scan(scanCtx, pending)
	cancel()
	if err == errScanCut && !wait {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = c.update(ctx, 0, func(u *usage) {
		// What others reserved while this scan ran is kept (their files may or may not
		// have been seen: counted twice at worst, until the next scan).
		u.used = res.Bytes + res.TempBytes + pending - res.EvictedBytes + max(u.used-before.used, 0)
		u.lastScan = c.now().UnixNano()
	})
	c.scanned.Store(res)
	if err != nil {
		return &fs.PathError{Op: "update", Path: s.fs.abs(usageFileName), Err: err}
	}
	return nil
}

// capEntry is one page file found by a scan.
type capEntry struct {
	key    storage.Key
	name   string // file name in its fan-out directory
	dir    int32  // index of its fan-out directory in the scan's dirs
	parent int32  // index of its parent page, -1 when none is stored (or known)
	depth  int32  // pages before it in its chain that are stored; -1: not computed yet
	size   int64
	used   int64 // last use (Unix ns)
	seen   int64 // last use as the scan last saw it (after its own header read, if any)
	rank   int64 // latest use of it and of the pages after it in its chain
}

// lastUse is a page file's last use: the later of its atime (set by hits and Puts) and its
// mtime (its write).
func lastUse(st *unix.Stat_t) int64 {
	return max(st.Atim.Nano(), st.Mtim.Nano())
}

// expired reports whether a page file last used as st says is past the TTL.
func (c *dirCap) expired(st *unix.Stat_t) bool {
	return c.ttl > 0 && c.now().UnixNano()-lastUse(st) > int64(c.ttl)
}

// touch records a use of the page file fd: its atime is set to now (its mtime is left).
// Best effort: a file of another user (a shared root) keeps its time.
func (c *dirCap) touch(fd int) {
	ts := [2]unix.Timespec{unix.NsecToTimespec(c.now().UnixNano()), {Nsec: unix.UTIME_OMIT}}
	unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
}

// replaced gives back to the counter the bytes of the page file name in dir that a Delete is
// about to remove.
func (c *dirCap) replaced(dir int, name string) {
	var st unix.Stat_t
	if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		c.freed.Add(st.Size)
	}
}

// remember records the parent id of a page this store put, so that its scans need not read
// its header.
func (c *dirCap) remember(k storage.Key, bind *storage.Binding) {
	if bind == nil || bind.Parent == [32]byte{} {
		return
	}
	c.mu.Lock()
	if c.parents[k] == nil {
		c.parents[k] = &parentInfo{id: bind.Parent, bound: true}
	}
	c.mu.Unlock()
}

// errScanCut: a scan ran out of its time (half of its call's); a Put that needed the room
// fails with it (ErrUnavailable, kindOf) rather than write past the capacity.
var errScanCut = errors.New("the eviction scan did not finish within half of the call's time")

// scan lists every page file under the root, ranks them and removes them in rank order while
// the bytes used, with pending bytes about to be written, are above the low watermark or the
// page is past the TTL.
func (s *dirStore) scan(ctx context.Context, pending int64) (*capScanResult, error) {
	c := s.cap
	res := &capScanResult{}
	var dirs []string
	var ents []capEntry
	index := map[storage.Key]int32{}
	cut := func() error {
		if ctx.Err() != nil {
			return errScanCut
		}
		return nil
	}
	isHex := func(name string, n int) bool {
		if len(name) != n {
			return false
		}
		_, err := hex.DecodeString(name)
		return err == nil
	}
	var nss []string
	if err := readNames(s.fs.fd, s.where, func(name string, typ uint32) (bool, error) {
		if isHex(name, 2*storage.NamespaceSize) && (typ == unix.S_IFDIR || typ == 0) {
			nss = append(nss, name)
		}
		return true, nil
	}); err != nil {
		return nil, err
	}
	for _, ns := range nss {
		nsID, _ := hex.DecodeString(ns)
		nsFD, err := s.fs.openDir(ns)
		if err != nil {
			continue // gone (a Clear), a link (not followed) or not a directory
		}
		var fans []string
		err = readNames(nsFD, s.fs.abs(ns), func(name string, typ uint32) (bool, error) {
			if isHex(name, 2) && (typ == unix.S_IFDIR || typ == 0) {
				fans = append(fans, name)
			}
			return true, cut()
		})
		unix.Close(nsFD)
		if err != nil {
			return nil, err
		}
		for _, fan := range fans {
			rel := ns + "/" + fan
			fd, err := s.fs.openDir(rel)
			if err != nil {
				continue
			}
			di := int32(len(dirs))
			dirs = append(dirs, rel)
			// The directory is listed through its own descriptor (not readNames' fresh one):
			// one open per fan-out directory and scan, the most of a scan's system calls
			// when there are few pages per directory.
			dirFile := os.NewFile(uintptr(fd), s.fs.abs(rel))
			names, err := dirFile.Readdirnames(-1)
			for _, name := range names {
				if err = cut(); err != nil {
					break
				}
				page := isHex(name, 2*(storage.KeySize-storage.NamespaceSize))
				if !page && !strings.HasPrefix(name, ".tmp-") {
					continue
				}
				var st unix.Stat_t
				if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
					continue
				}
				if !page {
					res.TempBytes += st.Size
					continue
				}
				var k storage.Key
				copy(k[:], nsID)
				hex.Decode(k[storage.NamespaceSize:], []byte(name))
				index[k] = int32(len(ents))
				ents = append(ents, capEntry{key: k, name: name, dir: di, parent: -1, depth: -1, size: st.Size, used: lastUse(&st), seen: lastUse(&st)})
				res.Pages++
				res.Bytes += st.Size
			}
			if err == nil {
				err = s.readParents(ctx, fd, di, ents)
			}
			dirFile.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	c.resolveParents(ents, index)
	order := rankPages(ents)
	// Remove in rank order: past the TTL, then down to the low watermark.
	total := res.Bytes + res.TempBytes + pending
	now := c.now().UnixNano()
	var victims []int32
	for _, i := range order {
		e := &ents[i]
		expired := c.ttl > 0 && now-e.rank > int64(c.ttl)
		if !expired && (c.max == 0 || total <= c.low) {
			break
		}
		victims = append(victims, i)
		total -= e.size
	}
	slices.SortFunc(victims, func(a, b int32) int { return int(ents[a].dir) - int(ents[b].dir) })
	for lo := 0; lo < len(victims); {
		hi := lo
		for hi < len(victims) && ents[victims[hi]].dir == ents[victims[lo]].dir {
			hi++
		}
		fd, err := s.fs.openDir(dirs[ents[victims[lo]].dir])
		if err == nil {
			for _, i := range victims[lo:hi] {
				if ctx.Err() != nil {
					break
				}
				e := &ents[i]
				// A page used since the scan listed it stays (another store read it).
				var st unix.Stat_t
				if unix.Fstatat(fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || lastUse(&st) != e.seen ||
					unix.Unlinkat(fd, e.name, 0) != nil {
					continue
				}
				res.EvictedBytes += e.size
				if c.ttl > 0 && now-e.rank > int64(c.ttl) {
					res.Expired++
					s.stats.expired.Add(1)
				} else {
					res.Evicted++
					s.stats.evicted.Add(1)
				}
			}
			unix.Close(fd)
		}
		lo = hi
	}
	c.mu.Lock()
	for _, i := range victims {
		delete(c.parents, ents[i].key)
	}
	if len(c.parents) > 2*len(ents)+1024 { // pages removed by others: forget them
		for k := range c.parents {
			if _, ok := index[k]; !ok {
				delete(c.parents, k)
			}
		}
	}
	c.mu.Unlock()
	if ctx.Err() != nil {
		return nil, errScanCut
	}
	return res, nil
}

// readParents reads, for the pages of fan-out directory di (open as fd) whose parent id this
// store does not know, their header's parent id (into c.parents). resolveParents links them
// once every directory is listed.
func (s *dirStore) readParents(ctx context.Context, fd int, di int32, ents []capEntry) error {
	c := s.cap
	var hdr [storage.HeaderSize]byte
	for i := len(ents) - 1; i >= 0 && ents[i].dir == di; i-- {
		e := &ents[i]
		c.mu.Lock()
		_, known := c.parents[e.key]
		c.mu.Unlock()
		if known {
			continue
		}
		if ctx.Err() != nil {
			return errScanCut
		}
		// O_NOATIME: reading the header is no use of the page (the kernel refuses it on a
		// file of another user: the time the read leaves is then what the unlink checks).
		const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
		pfd, err := openat(fd, e.name, flags|unix.O_NOATIME, 0)
		if err == unix.EPERM {
			pfd, err = openat(fd, e.name, flags, 0)
		}
		if err != nil {
			continue
		}
		n, _ := preadFull(pfd, hdr[:])
		var st unix.Stat_t
		if fstat(pfd, &st) == nil {
			e.seen = lastUse(&st)
		}
		unix.Close(pfd)
		parent, ok := storage.PeekParent(hdr[:n])
		c.mu.Lock()
		c.parents[e.key] = &parentInfo{id: parent, bound: ok}
		c.mu.Unlock()
	}
	return nil
}

// parentInfo is what the scans know of a page's parent.
type parentInfo struct {
	id     [32]byte    // the parent's id, from the page's header binding
	bound  bool        // the header binds a parent (false: Put without a binding, another format)
	key    storage.Key // the parent's key, once a scan found it
	found  bool
	misses uint8 // scans that looked for the parent's key in vain
}

// maxParentMisses is how many scans look for a page's parent before it is taken for a
// chain's first page (its parent is its isolation key's root, never stored): a few, so that
// a page listed before its parent was written is linked by a later scan.
const maxParentMisses = 3

// resolveParents links each page to its stored parent page: the key of the page whose id is
// its header's parent id, in the same namespace and tensor-parallel shard. The shard is not
// stored; the shards seen before are tried first, then 0..maxShardGuess-1. A parent key
// found once is kept (it never changes: the page is its id's).
func (c *dirCap) resolveParents(ents []capEntry, index map[storage.Key]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range ents {
		e := &ents[i]
		info := c.parents[e.key]
		switch {
		case info == nil || !info.bound:
			continue
		case info.found:
			if j, ok := index[info.key]; ok && j != int32(i) {
				e.parent = j
			}
			continue
		case info.misses >= maxParentMisses:
			continue
		}
		ns := [storage.NamespaceSize]byte(e.key[:storage.NamespaceSize])
		try := func(shard uint32) bool {
			k := storage.PageKeyIn(ns, info.id, shard)
			if j, ok := index[k]; ok && j != int32(i) {
				e.parent, info.key, info.found = j, k, true
				return true
			}
			return false
		}
		found := false
		for n, sh := range c.shards {
			if try(sh) {
				found = true
				if n > 0 { // most recent first
					copy(c.shards[1:n+1], c.shards[:n])
					c.shards[0] = sh
				}
				break
			}
		}
		for sh := uint32(0); !found && sh < maxShardGuess; sh++ {
			if !slices.Contains(c.shards, sh) && try(sh) {
				found = true
				c.shards = slices.Insert(c.shards, 0, sh)
			}
		}
		if !found {
			info.misses++
		}
	}
}

// rankPages orders ents for eviction: by rank (the latest use of the page and of every page
// after it in its chain), deeper pages first among equals, then by the page's own use. It
// fills depth and rank.
func rankPages(ents []capEntry) []int32 {
	for i := range ents {
		// Follow the parents up to a page whose depth is known, then set it down the path.
		var path []int32
		j := int32(i)
		for j >= 0 && ents[j].depth == -1 {
			ents[j].depth = -2 // on the path: a cycle (forged headers) ends here
			path = append(path, j)
			j = ents[j].parent
		}
		d := int32(-1)
		if j >= 0 && ents[j].depth >= 0 {
			d = ents[j].depth
		}
		for k := len(path) - 1; k >= 0; k-- {
			d++
			ents[path[k]].depth = d
		}
	}
	order := make([]int32, len(ents))
	for i := range ents {
		order[i] = int32(i)
		ents[i].rank = ents[i].used
	}
	// Deepest first: a page's rank is final before it is given to its parent.
	slices.SortFunc(order, func(a, b int32) int { return int(ents[b].depth) - int(ents[a].depth) })
	for _, i := range order {
		if p := ents[i].parent; p >= 0 && ents[p].depth < ents[i].depth {
			ents[p].rank = max(ents[p].rank, ents[i].rank)
		}
	}
	slices.SortFunc(order, func(a, b int32) int {
		x, y := &ents[a], &ents[b]
		switch {
		case x.rank != y.rank:
			return cmpInt64(x.rank, y.rank)
		case x.depth != y.depth:
			return int(y.depth) - int(x.depth)
		}
		return cmpInt64(x.used, y.used)
	})
	return order
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
