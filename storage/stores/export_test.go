package stores

import (
	"sync"
	"time"

	"github.com/cpcache/cpcache/storage"
)

// Test hooks into the backends' internals.

// DirPath returns the file that holds k in a directory storage.
func DirPath(s storage.Storage, k storage.Key) string {
	_, name := s.(*purging).backend.(*dirStore).path(k)
	return name
}

// RedisKeyName returns the Redis key that holds k.
func RedisKeyName(s storage.Storage, k storage.Key) string {
	return s.(*purging).backend.(*redisStore).name(k)
}

// MutateMem replaces the stored bytes of k in mem table name with mutate(old).
func MutateMem(name string, k storage.Key, mutate func([]byte) []byte) bool {
	memTablesMu.Lock()
	t := memTables[name]
	memTablesMu.Unlock()
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.vals[k]
	if ok {
		t.vals[k] = mutate(append([]byte(nil), v...))
	}
	return ok
}

// ForceComponentWalk makes directory stores opened from now on open paths one component
// at a time (as without openat2) when walk is set; the returned function undoes it.
func ForceComponentWalk(walk bool) func() {
	old := forceWalk
	forceWalk = walk
	return func() { forceWalk = old }
}

// DirWalks reports whether directory storage s opens paths one component at a time.
func DirWalks(s storage.Storage) bool { return s.(*purging).backend.(*dirStore).fs.walk }

// FreezeOpen makes directory stores opened from now on block, before their open touches
// the file system, where a dead mount would, whatever the open's context, until the
// returned thaw is called (which also undoes the hook).
func FreezeOpen() (thaw func()) {
	ch := make(chan struct{})
	g := func(string) { <-ch }
	openDirGate.Store(&g)
	var once sync.Once
	return func() { once.Do(func() { openDirGate.Store(nil); close(ch) }) }
}

// SetMACAlg makes stores opened from now on write payload MACs of alg; the returned
// function undoes it.
func SetMACAlg(alg storage.MACAlg) func() {
	old := newMAC
	newMAC = func(key []byte) *storage.MAC { return storage.NewMACAlg(key, alg) }
	return func() { newMAC = old }
}

// DirInPlaceReads is how many pages directory storage s read straight into place
// (RWF_NOWAIT from the page cache), and whether its file system takes that flag.
func DirInPlaceReads(s storage.Storage) (uint64, bool) {
	d := s.(*purging).backend.(*dirStore)
	return d.inPlace.Load(), d.noWait.Load()
}

// DirNoWait sets whether directory storage s tries to read pages straight into place.
func DirNoWait(s storage.Storage, on bool) { s.(*purging).backend.(*dirStore).noWait.Store(on) }

// SetDirClock makes directory storage s (opened with a capacity or a TTL) read its clock
// from now: the times it records as uses and judges the TTL by.
func SetDirClock(s storage.Storage, now func() time.Time) {
	s.(*purging).backend.(*dirStore).cap.now = now
}

// DirUsage reads the shared usage counter of directory storage s: the bytes it says are
// used, and whether a scan ever set it.
func DirUsage(s storage.Storage) (used int64, scanned bool) {
	u, err := s.(*purging).backend.(*dirStore).cap.readUsage()
	if err != nil {
		panic(err)
	}
	return u.used, u.lastScan != 0
}

// DirLowWater and DirHighWater are the eviction's watermarks for a capacity of max bytes.
func DirLowWater(max int64) int64  { return (&dirCap{max: max}).watermarks().low }
func DirHighWater(max int64) int64 { return (&dirCap{max: max}).watermarks().high }
