package slab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cpcache/cpcache/parallel"
)

// fakeDevice is an in-process DeviceBackend: "device memory" is an address range; the IPC
// handle is the address in decimal.
type fakeDevice struct {
	mu     sync.Mutex // protects next and open
	next   uintptr
	open   int // regions not yet closed
	failOn int // device ordinal whose Open fails (-1: none)
}

type fakeRegion struct {
	d      *fakeDevice
	ptr    uintptr
	closed bool
}

func (r *fakeRegion) Ptr() uintptr { return r.ptr }
func (r *fakeRegion) Close() error {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.d.open--
	}
	return nil
}

func (d *fakeDevice) Alloc(device, size int) (DeviceRegion, []byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next += 1 << 30
	d.open++
	return &fakeRegion{d: d, ptr: d.next}, []byte(fmt.Sprint(d.next)), nil
}

func (d *fakeDevice) Open(device int, handle []byte, size int) (DeviceRegion, error) {
	if device == d.failOn {
		return nil, fmt.Errorf("fake: device %d cannot open handle %s", device, handle)
	}
	var p uintptr
	if _, err := fmt.Sscan(string(handle), &p); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.open++
	return &fakeRegion{d: d, ptr: p}, nil
}

func TestDeviceBackendSlabsGiveDevicePointers(t *testing.T) {
	fake := &fakeDevice{failOn: -1}
	errs := runMembers(3, func(g parallel.Group) error {
		spec := Spec{Backend: CUDAIPC, PageSize: 1 << 20, Pages: 8, Device: g.Rank(), DeviceBackend: fake}
		s, err := OpenSet(context.Background(), g, spec)
		if err != nil {
			return err
		}
		defer s.Close()
		var bases []uintptr
		for r := range 3 {
			p0, err := s.DevicePtr(Page{Slab: r, Index: 0})
			if err != nil {
				return err
			}
			p5, _ := s.DevicePtr(Page{Slab: r, Index: 5})
			if p5 != p0+5<<20 {
				return fmt.Errorf("slab %d: page 5 at %#x, page 0 at %#x", r, p5, p0)
			}
			bases = append(bases, p0)
		}
		if _, err := s.Page(Page{Slab: 0, Index: 0}); !errors.Is(err, ErrUnsupported) {
			return fmt.Errorf("Page on a device slab: %v", err)
		}
		if _, err := s.DevicePtr(Page{Slab: 0, Index: 8}); !errors.Is(err, ErrBadArgument) {
			return fmt.Errorf("DevicePtr out of range: %v", err)
		}
		// Every rank sees the same address for each slab (the fake's handles are addresses).
		data := []byte(fmt.Sprint(bases))
		all, err := g.AllGather(context.Background(), data)
		if err != nil {
			return err
		}
		for r, b := range all {
			if string(b) != string(data) {
				return fmt.Errorf("rank %d sees slabs at %s, this rank at %s", r, b, data)
			}
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if fake.open != 0 {
		t.Fatalf("%d device regions left open after Close", fake.open)
	}
}

func TestDeviceOpenFailureOnOneRankFailsEveryRank(t *testing.T) {
	fake := &fakeDevice{failOn: 1}
	allFailAlike(t, 3, func(r int) Spec {
		return Spec{Backend: CUDAIPC, PageSize: 4096, Pages: 2, Device: r, DeviceBackend: fake}
	}, ErrSetup, "rank 1 (global 1) could not map", "fake: device 1 cannot open")
	if fake.open != 0 {
		t.Fatalf("%d device regions left open after the failed setup", fake.open)
	}
}

type fakePinner struct {
	mu     sync.Mutex // protects pinned and calls
	pinned int
	calls  int
	failAt int // fail the failAt-th call (1-based; 0: never)
}

func (p *fakePinner) Pin(mem []byte) (DeviceRegion, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls == p.failAt {
		return nil, errors.New("fake: cuMemHostRegister failed")
	}
	p.pinned++
	return &pinnedRegion{p: p, ptr: uintptr(p.calls) << 32}, nil
}

type pinnedRegion struct {
	p      *fakePinner
	ptr    uintptr
	closed bool
}

func (r *pinnedRegion) Ptr() uintptr { return r.ptr }
func (r *pinnedRegion) Close() error {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.p.pinned--
	}
	return nil
}

func TestPinHostRegistersEverySlabAndUnpinsOnClose(t *testing.T) {
	pin := &fakePinner{}
	tag := uniqueTag(t)
	errs := runMembers(2, func(g parallel.Group) error {
		spec := hostSpec(tag)
		spec.PinHost, spec.Pinner = true, pin
		s, err := OpenSet(context.Background(), g, spec)
		if err != nil {
			return err
		}
		defer s.Close()
		for r := range 2 {
			if sl, _ := s.Slab(r); !sl.Pinned() || sl.Owner() != r || sl.Backend() != Host {
				return fmt.Errorf("slab %d: pinned %v owner %d backend %s", r, sl.Pinned(), sl.Owner(), sl.Backend())
			}
			p0, err0 := s.DevicePtr(Page{Slab: r, Index: 0})
			p3, err3 := s.DevicePtr(Page{Slab: r, Index: 3})
			if err0 != nil || err3 != nil || p0 == 0 || p3 != p0+3*4096 {
				return fmt.Errorf("pinned slab %d: device pointers %#x, %#x (%v, %v)", r, p0, p3, err0, err3)
			}
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if pin.pinned != 0 || pin.calls != 4 {
		t.Fatalf("after Close: %d still pinned, %d pin calls (want 0, 4)", pin.pinned, pin.calls)
	}

	// A pin failure on one rank fails every rank.
	failing := &fakePinner{failAt: 1}
	errs = runMembers(2, func(g parallel.Group) error {
		spec := hostSpec(tag)
		spec.PinHost, spec.Pinner = true, failing
		_, err := OpenSet(context.Background(), g, spec)
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "cuMemHostRegister failed") {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if left := leftovers(tag); len(left) != 0 {
		t.Fatalf("segments left: %v", left)
	}
}
