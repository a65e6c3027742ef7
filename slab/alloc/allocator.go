package alloc

import (
	"fmt"
	"slices"
)

// Allocator is the replicated L2 page allocator of one slab set: C slabs of P pages each.
//
// It is a deterministic, single-threaded state machine with no I/O and no goroutines: every
// rank of the replica group holds one and applies the same calls in the same order, so every
// replica holds the same state and the same Digest. Page choice is a pure function of the
// current state (page j of a reservation starting at sequence page s goes to slab (s+j) mod C,
// at the lowest free index of that slab), so two replicas with equal used sets choose the
// same pages whatever their history.
//
// An Allocator is not safe for concurrent use; its owner serialises calls.
type Allocator struct {
	slabs, perSlab int

	free      []bitTree // free[s]: the free indices of slab s
	freeCount []int     // freeCount[s]: number of free pages in slab s
	ranges    map[RangeID]*rangeState

	reservedPages  int // pages in ranges that are reserved, not committed
	committedPages int // pages in committed ranges

	digest uint64
	fresh  uint64 // digest of the all-free pool
}

type rangeState struct {
	pages     []Page
	committed bool
}

// New returns an all-free allocator of slabs × pagesPerSlab pages.
func New(slabs, pagesPerSlab int) (*Allocator, error) {
	if slabs <= 0 || pagesPerSlab <= 0 || pagesPerSlab > 1<<31-1 {
		return nil, fmt.Errorf("%w: allocator shape %d slabs × %d pages (both must be positive, pages < 2^31)", ErrBadArgument, slabs, pagesPerSlab)
	}
	a := &Allocator{
		slabs:     slabs,
		perSlab:   pagesPerSlab,
		free:      make([]bitTree, slabs),
		freeCount: make([]int, slabs),
		fresh:     freshDigest(slabs, pagesPerSlab),
	}
	for s := range a.free {
		a.free[s] = newBitTree(pagesPerSlab)
	}
	a.resetCounters()
	return a, nil
}

func (a *Allocator) resetCounters() {
	for s := range a.freeCount {
		a.freeCount[s] = a.perSlab
	}
	a.ranges = map[RangeID]*rangeState{}
	a.reservedPages, a.committedPages = 0, 0
	a.digest = a.fresh
}

// Reset returns the allocator to exactly its freshly constructed state: every page of every
// slab free, no ranges, nothing reserved or committed, the fresh digest. Cost O(total pages/64).
func (a *Allocator) Reset() {
	for s := range a.free {
		a.free[s].fill()
	}
	a.resetCounters()
}

// Slabs is the number of slabs C.
func (a *Allocator) Slabs() int { return a.slabs }

// PagesPerSlab is the number of pages in each slab.
func (a *Allocator) PagesPerSlab() int { return a.perSlab }

// Digest is the placement digest: a hash of the state (which pages are used, by which range,
// committed or not), maintained in O(1) per page change. Equal states give equal digests.
func (a *Allocator) Digest() uint64 { return a.digest }

// DigestPair returns the digest folded to 63 bits as (d, -d), ready for one MIN all-reduce
// that yields both the minimum and the maximum over the group (d never equals MinInt64, so
// the negation cannot overflow). The group agrees iff min(d) == -min(-d).
func (a *Allocator) DigestPair() (d, negD int64) {
	d = int64(a.digest & (1<<63 - 1))
	return d, -d
}

// need returns how many pages a reservation of k pages from sequence page start takes in
// slab s.
func (a *Allocator) need(start, k, s int) int {
	first := (s - start%a.slabs + a.slabs) % a.slabs // first j with (start+j) mod C == s
	if first >= k {
		return 0
	}
	return (k-first-1)/a.slabs + 1
}

// fitsNow reports whether k pages from sequence page start fit in the free pages; when not,
// it returns the first slab (in reservation order) that lacks space and its need. The slab
// of page j gets k/C pages, plus one for the first k mod C slabs in reservation order.
func (a *Allocator) fitsNow(start, k int) (ok bool, slab, need int) {
	base, extra := k/a.slabs, k%a.slabs
	s := start % a.slabs
	for j := range a.slabs {
		n := base
		if j < extra {
			n++
		}
		if n > a.freeCount[s] {
			return false, s, n
		}
		if s++; s == a.slabs {
			s = 0
		}
	}
	return true, 0, 0
}

// Fits reports whether Reserve(id, start, k) would succeed on space grounds (it does not
// check the id). It is false for k <= 0 or negative start.
func (a *Allocator) Fits(start, k int) bool {
	if k <= 0 || start < 0 {
		return false
	}
	ok, _, _ := a.fitsNow(start, k)
	return ok
}

// Shortfall returns, per slab, how many more free pages Reserve(_, start, k) needs than the
// slab has now (0 where it fits). hicache evicts until every entry is 0.
func (a *Allocator) Shortfall(start, k int) []int {
	out := make([]int, a.slabs)
	if k <= 0 || start < 0 {
		return out
	}
	for s := range out {
		out[s] = max(0, a.need(start, k, s)-a.freeCount[s])
	}
	return out
}

// Reserve takes k pages for range id, all or nothing: page j (0 <= j < k) of the reservation
// is sequence page start+j and lives in slab (start+j) mod C, at that slab's lowest free
// index. start is the index, within the sequence, of the range's first page (for a radix-tree
// node: the number of pages above it), so page ownership follows the CP KV layout.
//
// The range is reserved, not committed: Commit it once the group agreed the write finished,
// or Abort it. Errors: ErrBadArgument (k <= 0, start < 0), ErrRangeExists, ErrTooLarge (can
// never fit), ErrNoSpace (does not fit now; a normal result). On error nothing changes.
// The returned slice is the caller's.
func (a *Allocator) Reserve(id RangeID, start, k int) ([]Page, error) {
	if k <= 0 || start < 0 {
		return nil, rangeErr("reserve", id, ErrBadArgument, "%d pages from sequence page %d (need k > 0, start >= 0)", k, start)
	}
	if _, ok := a.ranges[id]; ok {
		return nil, rangeErr("reserve", id, ErrRangeExists, "")
	}
	// The most any one slab must give: ceil(k/C), without k+C-1, which overflows for huge k.
	if n := k/a.slabs + min(1, k%a.slabs); n > a.perSlab {
		return nil, rangeErr("reserve", id, ErrTooLarge, "%d pages from sequence page %d need %d pages in slab %d, which has %d", k, start, n, start%a.slabs, a.perSlab)
	}
	if ok, s, n := a.fitsNow(start, k); !ok {
		return nil, rangeErr("reserve", id, ErrNoSpace, "%d pages from sequence page %d need %d pages in slab %d, which has %d free", k, start, n, s, a.freeCount[s])
	}
	pages := make([]Page, k)
	rk := rangeKey(id)
	s := start % a.slabs
	for j := range pages {
		i := a.free[s].lowest()
		a.free[s].take(i)
		a.freeCount[s]--
		p := Page{Slab: s, Index: i}
		pages[j] = p
		a.digest += termOf(pageBase(p, rk), false)
		if s++; s == a.slabs {
			s = 0
		}
	}
	a.ranges[id] = &rangeState{pages: pages}
	a.reservedPages += k
	return slices.Clone(pages), nil
}

// Commit marks a reserved range committed (its data is agreed written on every rank).
// Errors: ErrUnknownRange, ErrCommitted.
func (a *Allocator) Commit(id RangeID) error {
	r, ok := a.ranges[id]
	if !ok {
		return rangeErr("commit", id, ErrUnknownRange, "")
	}
	if r.committed {
		return rangeErr("commit", id, ErrCommitted, "")
	}
	rk := rangeKey(id)
	for _, p := range r.pages {
		b := pageBase(p, rk)
		a.digest += termOf(b, true) - termOf(b, false)
	}
	r.committed = true
	a.reservedPages -= len(r.pages)
	a.committedPages += len(r.pages)
	return nil
}

// Abort releases a reserved, uncommitted range (the group disagreed, or the write failed).
// Errors: ErrDoubleFree (also ErrUnknownRange), ErrCommitted (use Free).
func (a *Allocator) Abort(id RangeID) error {
	r, ok := a.ranges[id]
	if !ok {
		return rangeErr("abort", id, ErrDoubleFree, "no such range (already freed or aborted, or never reserved)")
	}
	if r.committed {
		return rangeErr("abort", id, ErrCommitted, "use Free for committed ranges")
	}
	a.release(id, r)
	a.reservedPages -= len(r.pages)
	return nil
}

// Free releases a committed range (eviction). The caller guarantees no rank still has I/O in
// flight on its pages. Errors: ErrDoubleFree (also ErrUnknownRange), ErrNotCommitted (use
// Abort).
func (a *Allocator) Free(id RangeID) error {
	r, ok := a.ranges[id]
	if !ok {
		return rangeErr("free", id, ErrDoubleFree, "no such range (already freed or aborted, or never reserved)")
	}
	if !r.committed {
		return rangeErr("free", id, ErrNotCommitted, "use Abort for reserved ranges")
	}
	a.release(id, r)
	a.committedPages -= len(r.pages)
	return nil
}

func (a *Allocator) release(id RangeID, r *rangeState) {
	rk := rangeKey(id)
	for _, p := range r.pages {
		a.digest -= termOf(pageBase(p, rk), r.committed)
		a.free[p.Slab].put(p.Index)
		a.freeCount[p.Slab]++
	}
	delete(a.ranges, id)
}

// Split divides range id at page at, for a radix-tree node split: newID takes the first at
// pages (the new parent, the prefix), id keeps the rest; both keep id's committed state. No
// page moves. Errors: ErrUnknownRange, ErrRangeExists (newID), ErrBadArgument
// (at outside 1..len-1, or newID == id).
func (a *Allocator) Split(id RangeID, at int, newID RangeID) error {
	r, ok := a.ranges[id]
	if !ok {
		return rangeErr("split", id, ErrUnknownRange, "")
	}
	if newID == id {
		return rangeErr("split", id, ErrBadArgument, "new range id %d equals the split range", newID)
	}
	if _, ok := a.ranges[newID]; ok {
		return rangeErr("split", id, ErrRangeExists, "new range id %d", newID)
	}
	if at <= 0 || at >= len(r.pages) {
		return rangeErr("split", id, ErrBadArgument, "split point %d outside 1..%d", at, len(r.pages)-1)
	}
	// The two halves share r.pages' array: range pages are never appended to or written
	// after Reserve, and callers only ever get clones.
	head := r.pages[:at:at]
	oldKey, newKey := rangeKey(id), rangeKey(newID)
	for _, p := range head {
		a.digest += termOf(pageBase(p, newKey), r.committed) - termOf(pageBase(p, oldKey), r.committed)
	}
	r.pages = r.pages[at:]
	a.ranges[newID] = &rangeState{pages: head, committed: r.committed}
	return nil
}
