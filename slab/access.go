package slab

import "fmt"

// checkLocked validates p against the set's shape; the caller holds s.mu.
func (s *Set) checkLocked(p Page) (*Slab, error) {
	if s.closed {
		return nil, ErrClosed
	}
	if p.Slab < 0 || p.Slab >= len(s.slabs) || p.Index < 0 || p.Index >= s.spec.Pages {
		return nil, fmt.Errorf("%w: page %v outside %d slabs × %d pages", ErrBadArgument, p, len(s.slabs), s.spec.Pages)
	}
	return s.slabs[p.Slab], nil
}

// Page returns the bytes of host page p: a slice of the shared mapping, exactly PageSize long
// (its capacity too). It is the only way this package hands out mapped memory; the slice is
// valid until Close and must not be used after it. Device slabs return ErrUnsupported (use
// DevicePtr).
func (s *Set) Page(p Page) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, err := s.checkLocked(p)
	if err != nil {
		return nil, err
	}
	if sl.host == nil {
		return nil, fmt.Errorf("%w: page %v is device memory (use DevicePtr)", ErrUnsupported, p)
	}
	off := p.Index * s.spec.PageSize
	return sl.host.mem[off : off+s.spec.PageSize : off+s.spec.PageSize], nil
}

// DevicePtr returns the device address of page p: device memory of a CUDAIPC set, or the
// device-visible address of a pinned host slab (Spec.PinHost with Spec.Pinner).
func (s *Set) DevicePtr(p Page) (uintptr, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, err := s.checkLocked(p)
	if err != nil {
		return 0, err
	}
	region := sl.dev
	if region == nil {
		region = sl.pinned
	}
	if region == nil {
		return 0, fmt.Errorf("%w: page %v is host memory not registered with CUDA (use Page, or Spec.PinHost)", ErrUnsupported, p)
	}
	return region.Ptr() + uintptr(p.Index*s.spec.PageSize), nil
}

// WritePage copies src into host page p; src may be shorter than a page, not longer.
func (s *Set) WritePage(p Page, src []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, err := s.checkLocked(p)
	if err != nil {
		return err
	}
	if sl.host == nil {
		return fmt.Errorf("%w: page %v is device memory", ErrUnsupported, p)
	}
	if len(src) > s.spec.PageSize {
		return fmt.Errorf("%w: %d bytes into page %v of %d bytes", ErrBadArgument, len(src), p, s.spec.PageSize)
	}
	copy(sl.host.mem[p.Index*s.spec.PageSize:], src)
	return nil
}

// ReadPage copies host page p into dst (at most a page, at most len(dst)) and returns the
// number of bytes copied.
func (s *Set) ReadPage(p Page, dst []byte) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, err := s.checkLocked(p)
	if err != nil {
		return 0, err
	}
	if sl.host == nil {
		return 0, fmt.Errorf("%w: page %v is device memory", ErrUnsupported, p)
	}
	off := p.Index * s.spec.PageSize
	return copy(dst, sl.host.mem[off:off+s.spec.PageSize]), nil
}

// SlabMemory returns the whole host memory of slab i (PagesPerSlab × PageSize bytes, its
// capacity too): what an L2 layout that spreads a page over the slab (kvmem.LayerFirst)
// addresses. Valid until Close, as Page's slices. Device slabs return ErrUnsupported.
func (s *Set) SlabMemory(i int) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, err := s.checkLocked(Page{Slab: i})
	if err != nil {
		return nil, err
	}
	if sl.host == nil {
		return nil, fmt.Errorf("%w: slab %d is device memory (use DevicePtr)", ErrUnsupported, i)
	}
	n := s.spec.Bytes()
	return sl.host.mem[:n:n], nil
}
