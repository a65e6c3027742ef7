package cudaengine

import (
	"errors"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/slab"
)

// testPool is what the GPU tests copy between: a device L1 of pages pages of pb bytes, a
// pinned host L2 of as many pages (L2 page i at i × pb, reached through its device
// pointer) and an engine over both.
type testPool struct {
	l1 *cuda.DeviceBuffer
	l2 *cuda.HostBuffer
	e  *Engine
}

func newTestPool(dev *cuda.Device, pages, pb int, opts Options) (_ *testPool, err error) {
	p := &testPool{}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	if p.l1, err = dev.Alloc(pages * pb); err != nil {
		return nil, err
	}
	if p.l2, err = dev.AllocHost(pages * pb); err != nil {
		return nil, err
	}
	l2 := p.l2.DevicePtr()
	addr := func(pg slab.Page) (cuda.DevicePtr, error) { return l2.Add(pg.Index * pb), nil }
	if p.e, err = New(dev, p.l1.Ptr(), pages, pb, addr, opts); err != nil {
		return nil, err
	}
	return p, nil
}

// Close closes the engine, then the memory it copied between.
func (p *testPool) Close() error {
	var errs []error
	if p.e != nil {
		errs = append(errs, p.e.Close())
	}
	if p.l2 != nil {
		errs = append(errs, p.l2.Close())
	}
	if p.l1 != nil {
		errs = append(errs, p.l1.Close())
	}
	return errors.Join(errs...)
}
