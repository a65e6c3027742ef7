package slab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cpcache/cpcache/parallel"
)

// Slab is one rank's slab as mapped in this process.
type Slab struct {
	owner  int          // group rank that created it
	host   *hostRegion  // Host: the mapping (kept after close); nil for CUDAIPC
	dev    DeviceRegion // CUDAIPC: the allocation (own) or opened handle (peer)
	pinned DeviceRegion // Host with PinHost: the CUDA registration
}

// Owner is the group rank that created the slab.
func (s *Slab) Owner() int { return s.owner }

// Backend is where the slab's memory lives.
func (s *Slab) Backend() Backend {
	if s.host != nil {
		return Host
	}
	return CUDAIPC
}

// Pinned reports whether the slab's host memory is registered with CUDA in this process.
func (s *Slab) Pinned() bool { return s.pinned != nil }

func (s *Slab) close() error {
	if s == nil {
		return nil
	}
	var errs []error
	if s.pinned != nil {
		errs = append(errs, s.pinned.Close())
		s.pinned = nil
	}
	errs = append(errs, s.host.close())
	if s.dev != nil {
		errs = append(errs, s.dev.Close())
		s.dev = nil
	}
	return errors.Join(errs...)
}

// Set is the slabs of one group, one per rank, every one mapped in this process.
type Set struct {
	group parallel.Group // the group the set was opened over (the slab group)
	spec  Spec           // this rank's spec; its shared fields are equal on every rank

	// makers are the group ranks that made the slabs, in slab order: nil for OpenSet (slab r
	// was made by group rank r), the makers of OpenSharedSet.
	makers []int

	mu     sync.RWMutex // protects closed and the slabs' mappings (Close vs ReadPage/WritePage)
	closed bool
	slabs  []*Slab // slabs[i] was created by group rank makers[i] (or i)
}

// testHookAfterExchange, when set, runs after the handle exchange; a non-nil error makes
// OpenSet return at once without any cleanup, as if the process had crashed there.
var testHookAfterExchange func(rank int) error

// OpenSet creates this rank's slab, exchanges specs and handles with every member of group,
// maps every member's slab, and agrees on the outcome: it succeeds on every rank or fails on
// every rank with the same error, which names the ranks at fault (a spec mismatch wraps
// ErrSpecMismatch; a rank that could not create or map a slab, ErrSetup). Every member must
// call it, with its own spec. It makes exactly two AllGathers on group.
//
// Host segments are anonymous (memfd): each rank stops offering its own as soon as every
// member has mapped it (after the second AllGather), and on every failure path; the memory
// goes with the last process that maps it, so nothing of the set can outlive the job.
// The caller keeps ownership of group, which must outlive the Set.
func OpenSet(ctx context.Context, group parallel.Group, spec Spec) (*Set, error) {
	if group == nil {
		return nil, fmt.Errorf("%w: nil group", ErrBadArgument)
	}
	return openSet(ctx, group, spec, nil)
}

// OpenSharedSet is OpenSet where only some members make a slab and every member maps all of
// them: makers are the group ranks that make one (strictly increasing, at least one), slab i
// is made by group rank makers[i], and the others map without creating (the attention-TP
// ranks of a CP index sharing one slab, parallel.Layout.SharedSlabGroup). Every member must
// call it with the same makers and its own spec (every member's spec is compared). Ranks are
// then the makers' global ranks, and Rank is this member's own slab, or -1 when it made none.
func OpenSharedSet(ctx context.Context, group parallel.Group, spec Spec, makers []int) (*Set, error) {
	if group == nil {
		return nil, fmt.Errorf("%w: nil group", ErrBadArgument)
	}
	if len(makers) == 0 {
		return nil, fmt.Errorf("%w: shared slab set on group %s without makers", ErrBadArgument, group.Name())
	}
	for i, m := range makers {
		if m < 0 || m >= group.Size() || (i > 0 && m <= makers[i-1]) {
			return nil, fmt.Errorf("%w: shared slab set on group %s: maker %d at position %d (makers %v must be increasing group ranks below %d)",
				ErrBadArgument, group.Name(), m, i, makers, group.Size())
		}
	}
	return openSet(ctx, group, spec, slices.Clone(makers))
}

// openSet is OpenSet (makers nil: every member makes one) and OpenSharedSet.
func openSet(ctx context.Context, group parallel.Group, spec Spec, makers []int) (*Set, error) {
	rank, size := group.Rank(), group.Size()
	be, pin := spec.DeviceBackend, spec.Pinner
	slabMakers := makers
	if slabMakers == nil {
		slabMakers = make([]int, size)
		for r := range slabMakers {
			slabMakers[r] = r
		}
	}
	ownIndex := slices.Index(slabMakers, rank)

	own, handle, localErr := (*Slab)(nil), []byte(nil), spec.validate()
	if localErr == nil && ownIndex >= 0 {
		own, handle, localErr = createSlab(spec, rank, be)
	}
	o := offer{Version: wireVersion, Spec: spec.shared(), Handle: handle}
	if localErr != nil {
		o.Err = localErr.Error()
	}
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("slab: encode offer: %w", err), discard(own))
	}
	gathered, err := group.AllGather(ctx, raw)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("slab: open set on group %s: handle exchange: %w", group.Name(), err), discard(own))
	}
	offers, err := verdict(group.Name(), group.Ranks(), gathered)
	if err != nil {
		return nil, errors.Join(err, discard(own))
	}
	if hook := testHookAfterExchange; hook != nil {
		if err := hook(rank); err != nil {
			return nil, err
		}
	}

	s := &Set{group: group, spec: spec, makers: makers, slabs: make([]*Slab, len(slabMakers))}
	if ownIndex >= 0 {
		s.slabs[ownIndex] = own
	}
	status := ""
	for i, r := range slabMakers {
		if r == rank {
			continue
		}
		peer, err := openSlab(ctx, spec, r, offers[r].Handle, be)
		if err != nil {
			status = fmt.Sprintf("slab of rank %d: %v", r, err)
			break
		}
		s.slabs[i] = peer
	}
	if status == "" && spec.Backend == Host && spec.PinHost {
		for _, sl := range s.slabs {
			if sl == nil {
				continue
			}
			if sl.pinned, err = pin.Pin(sl.host.mem); err != nil {
				status = fmt.Sprintf("pin slab of rank %d: %v", sl.owner, err)
				break
			}
		}
	}
	statuses, gatherErr := group.AllGather(ctx, []byte(status))
	// Every member has mapped every slab (or given up, or died): stop offering this rank's.
	// The segments are anonymous, so nothing of the set is left anywhere once the processes
	// that map them are gone, whatever way they go.
	var cleanup []error
	if own != nil {
		cleanup = append(cleanup, own.host.unshare())
	}
	if gatherErr != nil {
		err := fmt.Errorf("slab: open set on group %s: mapping barrier: %w", group.Name(), gatherErr)
		return nil, errors.Join(append([]error{err, s.closeAllLocked()}, cleanup...)...)
	}
	if err := mapVerdict(group.Name(), group.Ranks(), statuses); err != nil {
		return nil, errors.Join(append([]error{err, s.closeAllLocked()}, cleanup...)...)
	}
	// The cleanup errors of a successful set are dropped: an unlink error other than "not
	// found" cannot happen for a 0600 file we created in a directory we could create it in,
	// and failing here would fail this rank alone, so the set stays usable on every rank.
	return s, nil
}

// createSlab creates this rank's slab and returns its handle.
func createSlab(spec Spec, rank int, be DeviceBackend) (*Slab, []byte, error) {
	switch spec.Backend {
	case Host:
		h, err := createHost(spec, rank)
		if err != nil {
			return nil, nil, err
		}
		return &Slab{owner: rank, host: h}, []byte(h.handle), nil
	case CUDAIPC:
		if be == nil {
			return nil, nil, errNoDeviceBackend()
		}
		d, handle, err := be.Alloc(spec.Device, spec.Bytes())
		if err != nil {
			return nil, nil, fmt.Errorf("slab: allocate %d device bytes on device %d: %w", spec.Bytes(), spec.Device, err)
		}
		return &Slab{owner: rank, dev: d}, handle, nil
	}
	return nil, nil, fmt.Errorf("%w: backend %q", ErrBadArgument, spec.Backend)
}

// openSlab maps the slab of peer rank r from its handle.
func openSlab(ctx context.Context, spec Spec, r int, handle []byte, be DeviceBackend) (*Slab, error) {
	switch spec.Backend {
	case Host:
		h, err := openHost(ctx, spec, string(handle))
		if err != nil {
			return nil, err
		}
		return &Slab{owner: r, host: h}, nil
	case CUDAIPC:
		if be == nil {
			return nil, errNoDeviceBackend()
		}
		d, err := be.Open(spec.Device, handle, spec.Bytes())
		if err != nil {
			return nil, fmt.Errorf("slab: open IPC handle of rank %d on device %d: %w", r, spec.Device, err)
		}
		return &Slab{owner: r, dev: d}, nil
	}
	return nil, fmt.Errorf("%w: backend %q", ErrBadArgument, spec.Backend)
}

// discard unmaps (and stops offering) a slab this rank created, on a failure path.
func discard(own *Slab) error {
	if own == nil {
		return nil
	}
	return own.close()
}

// closeAllLocked closes every slab; the caller holds s.mu or has not published s yet.
func (s *Set) closeAllLocked() error {
	var errs []error
	for i, sl := range s.slabs {
		errs = append(errs, sl.close())
		s.slabs[i] = nil
	}
	return errors.Join(errs...)
}

// Close unmaps (and frees, for this rank's device slab) every slab. Slices returned by Page
// are invalid afterwards. It is nil-safe and idempotent; it does not close the group.
func (s *Set) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.closeAllLocked()
}

// Group is the group the set was opened over: the slab group.
func (s *Set) Group() parallel.Group { return s.group }

// Ranks are the global ranks of the slabs' makers, in slab order (slab r was created by
// Ranks()[r]): the slab group's ranks in group-rank order, or OpenSharedSet's makers.
func (s *Set) Ranks() []int {
	if s.makers == nil {
		return s.group.Ranks()
	}
	all := s.group.Ranks()
	out := make([]int, len(s.makers))
	for i, m := range s.makers {
		out[i] = all[m]
	}
	return out
}

// Rank is the index of this process's own slab: its group rank, or with OpenSharedSet its
// position among the makers (-1 when it made none).
func (s *Set) Rank() int {
	if s.makers == nil {
		return s.group.Rank()
	}
	return slices.Index(s.makers, s.group.Rank())
}

// Shared reports whether the set was opened by OpenSharedSet (members that map slabs they
// did not make).
func (s *Set) Shared() bool { return s.makers != nil }

// Size is the number of slabs (the group size).
func (s *Set) Size() int { return len(s.slabs) }

// Spec is this rank's spec (Backend, PageSize, Pages and Layout are equal on every rank).
func (s *Set) Spec() Spec { return s.spec }

// PageSize is the size of a page in bytes.
func (s *Set) PageSize() int { return s.spec.PageSize }

// PagesPerSlab is the number of pages in each slab.
func (s *Set) PagesPerSlab() int { return s.spec.Pages }

// Slab returns slab r (created by group rank r).
func (s *Set) Slab(r int) (*Slab, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	if r < 0 || r >= len(s.slabs) {
		return nil, fmt.Errorf("%w: slab %d outside 0..%d", ErrBadArgument, r, len(s.slabs)-1)
	}
	return s.slabs[r], nil
}
