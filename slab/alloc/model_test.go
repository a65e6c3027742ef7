package alloc

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
)

// model is a deliberately naive allocator: linear scans, the digest recomputed from scratch.
// It is the specification the optimised Allocator is checked against.
type model struct {
	slabs, perSlab int
	used           [][]bool
	ranges         map[RangeID]*rangeState
}

func newModel(slabs, perSlab int) *model {
	m := &model{slabs: slabs, perSlab: perSlab}
	m.reset()
	return m
}

func (m *model) reset() {
	m.used = make([][]bool, m.slabs)
	for s := range m.used {
		m.used[s] = make([]bool, m.perSlab)
	}
	m.ranges = map[RangeID]*rangeState{}
}

func (m *model) freeIn(s int) int {
	n := 0
	for _, u := range m.used[s] {
		if !u {
			n++
		}
	}
	return n
}

func (m *model) reserve(id RangeID, start, k int) ([]Page, error) {
	if k <= 0 || start < 0 {
		return nil, ErrBadArgument
	}
	if m.ranges[id] != nil {
		return nil, ErrRangeExists
	}
	need := make([]int, m.slabs)
	for j := 0; j < k; j++ {
		need[(start+j)%m.slabs]++
	}
	for _, n := range need {
		if n > m.perSlab {
			return nil, ErrTooLarge
		}
	}
	for s, n := range need {
		if n > m.freeIn(s) {
			return nil, ErrNoSpace
		}
	}
	var pages []Page
	for j := 0; j < k; j++ {
		s := (start + j) % m.slabs
		for i, u := range m.used[s] {
			if !u {
				m.used[s][i] = true
				pages = append(pages, Page{s, i})
				break
			}
		}
	}
	m.ranges[id] = &rangeState{pages: pages}
	return slices.Clone(pages), nil
}

func (m *model) commit(id RangeID) error {
	r := m.ranges[id]
	switch {
	case r == nil:
		return ErrUnknownRange
	case r.committed:
		return ErrCommitted
	}
	r.committed = true
	return nil
}

func (m *model) release(id RangeID, wantCommitted bool) error {
	r := m.ranges[id]
	switch {
	case r == nil:
		return ErrDoubleFree
	case r.committed && !wantCommitted:
		return ErrCommitted
	case !r.committed && wantCommitted:
		return ErrNotCommitted
	}
	for _, p := range r.pages {
		m.used[p.Slab][p.Index] = false
	}
	delete(m.ranges, id)
	return nil
}

func (m *model) split(id RangeID, at int, newID RangeID) error {
	r := m.ranges[id]
	switch {
	case r == nil:
		return ErrUnknownRange
	case newID == id:
		return ErrBadArgument
	case m.ranges[newID] != nil:
		return ErrRangeExists
	case at <= 0 || at >= len(r.pages):
		return ErrBadArgument
	}
	m.ranges[newID] = &rangeState{pages: slices.Clone(r.pages[:at]), committed: r.committed}
	r.pages = slices.Clone(r.pages[at:])
	return nil
}

func (m *model) digest() uint64 {
	d := freshDigest(m.slabs, m.perSlab)
	for id, r := range m.ranges {
		for _, p := range r.pages {
			d += pageTerm(p, id, r.committed)
		}
	}
	return d
}

// op is one allocator call, for replaying the same sequence on several replicas.
type op struct {
	kind     opKind
	id       RangeID
	start, k int     // reserve; k is also the split point
	newID    RangeID // split
}

type opKind uint8

const (
	opReserve opKind = iota
	opCommit
	opAbort
	opFree
	opSplit
	opReset
	numOpKinds
)

func (o op) String() string {
	switch o.kind {
	case opReserve:
		return fmt.Sprintf("reserve(%d, start %d, k %d)", o.id, o.start, o.k)
	case opCommit:
		return fmt.Sprintf("commit(%d)", o.id)
	case opAbort:
		return fmt.Sprintf("abort(%d)", o.id)
	case opFree:
		return fmt.Sprintf("free(%d)", o.id)
	case opSplit:
		return fmt.Sprintf("split(%d, at %d, new %d)", o.id, o.k, o.newID)
	case opReset:
		return "reset"
	}
	return fmt.Sprintf("op(%d)", o.kind)
}

// randomOp draws an op that often hits existing ranges; resets are rare.
func randomOp(r *rand.Rand, ids int, maxK int) op {
	o := op{id: RangeID(r.IntN(ids)), start: r.IntN(8), k: 1 + r.IntN(maxK), newID: RangeID(r.IntN(ids))}
	switch x := r.IntN(100); {
	case x < 40:
		o.kind = opReserve
	case x < 65:
		o.kind = opCommit
	case x < 75:
		o.kind = opAbort
	case x < 92:
		o.kind = opFree
	case x < 99:
		o.kind = opSplit
		o.k = 1 + r.IntN(4)
	default:
		o.kind = opReset
	}
	return o
}

// decodeOps turns fuzz bytes into ops, four bytes each.
func decodeOps(data []byte) []op {
	var ops []op
	for len(data) >= 4 {
		b := data[:4]
		data = data[4:]
		o := op{kind: opKind(b[0] % uint8(numOpKinds)), id: RangeID(b[1] % 16), start: int(b[2] % 8), k: int(b[3]%24) - 1, newID: RangeID(b[2] % 16)}
		if o.kind == opSplit {
			o.k = int(b[3] % 6)
		}
		ops = append(ops, o)
	}
	return ops
}

// apply runs o on a and returns the pages it reserved and its error.
func apply(a *Allocator, o op) ([]Page, error) {
	switch o.kind {
	case opReserve:
		return a.Reserve(o.id, o.start, o.k)
	case opCommit:
		return nil, a.Commit(o.id)
	case opAbort:
		return nil, a.Abort(o.id)
	case opFree:
		return nil, a.Free(o.id)
	case opSplit:
		return nil, a.Split(o.id, o.k, o.newID)
	case opReset:
		a.Reset()
	}
	return nil, nil
}

func (m *model) apply(o op) ([]Page, error) {
	switch o.kind {
	case opReserve:
		return m.reserve(o.id, o.start, o.k)
	case opCommit:
		return nil, m.commit(o.id)
	case opAbort:
		return nil, m.release(o.id, false)
	case opFree:
		return nil, m.release(o.id, true)
	case opSplit:
		return nil, m.split(o.id, o.k, o.newID)
	case opReset:
		m.reset()
	}
	return nil, nil
}

// sameErrClass reports whether got wraps the model's sentinel (and is nil iff want is nil).
func sameErrClass(got, want error) bool {
	if got == nil || want == nil {
		return got == nil && want == nil
	}
	return errors.Is(got, want)
}

// checkAgainstModel compares every observable of a with m.
func checkAgainstModel(a *Allocator, m *model) error {
	if got, want := a.Digest(), m.digest(); got != want {
		return fmt.Errorf("digest %#x, model %#x", got, want)
	}
	var reserved, committed int
	for id, r := range m.ranges {
		pages, c, ok := a.Range(id)
		if !ok || c != r.committed || !slices.Equal(pages, r.pages) {
			return fmt.Errorf("range %d: got %v committed=%v ok=%v, model %v committed=%v", id, pages, c, ok, r.pages, r.committed)
		}
		if c {
			committed += len(pages)
		} else {
			reserved += len(pages)
		}
	}
	if ids := slices.Sorted(maps.Keys(m.ranges)); !slices.Equal(a.Ranges(), ids) {
		return fmt.Errorf("ranges %v, model %v", a.Ranges(), ids)
	}
	if a.ReservedPages() != reserved || a.CommittedPages() != committed {
		return fmt.Errorf("reserved/committed pages %d/%d, model %d/%d", a.ReservedPages(), a.CommittedPages(), reserved, committed)
	}
	for s := range m.used {
		if a.FreePages(s) != m.freeIn(s) {
			return fmt.Errorf("slab %d: %d free, model %d", s, a.FreePages(s), m.freeIn(s))
		}
		for i, u := range m.used[s] {
			if free, _ := a.IsFree(Page{s, i}); free == u {
				return fmt.Errorf("page (%d,%d): free=%v, model used=%v", s, i, free, u)
			}
		}
	}
	return nil
}

// runAgainstModel replays ops on a fresh allocator and on the model, checking after each op.
func runAgainstModel(slabs, perSlab int, ops []op) error {
	a, err := New(slabs, perSlab)
	if err != nil {
		return err
	}
	m := newModel(slabs, perSlab)
	for n, o := range ops {
		gotPages, gotErr := apply(a, o)
		wantPages, wantErr := m.apply(o)
		if !sameErrClass(gotErr, wantErr) {
			return fmt.Errorf("op %d %v: error %v, model %v", n, o, gotErr, wantErr)
		}
		if !slices.Equal(gotPages, wantPages) {
			return fmt.Errorf("op %d %v: pages %v, model %v", n, o, gotPages, wantPages)
		}
		if err := checkAgainstModel(a, m); err != nil {
			return fmt.Errorf("after op %d %v: %w", n, o, err)
		}
	}
	return nil
}

// pageTerm is the digest contribution of one used page, computed from scratch.
func pageTerm(p Page, id RangeID, committed bool) uint64 {
	return termOf(pageBase(p, rangeKey(id)), committed)
}
