package cudaslab

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/slab"
)

// Backend is slab's DeviceBackend and HostPinner over the CUDA driver: device slabs are cuMemAlloc
// allocations exported with cuIpcGetMemHandle and opened by peers with cuIpcOpenMemHandle;
// pinned host slabs are registered with cuMemHostRegister (portable, device-mapped).
//
// Open it with Open, name it in the slab.Spec of the sets that use it (Spec), and Close it
// after every Set that used it. A process cannot open its own IPC handles, so a CUDAIPC set needs one
// process per rank.
type Backend struct {
	drv       *cuda.Driver
	pinDevice int

	mu     sync.Mutex // protects devs and closed
	devs   map[int]*cuda.Device
	closed bool
}

// Open loads the CUDA driver. pinDevice is the device whose context registers pinned host
// slabs (registration is portable: every context sees it). On a machine without a driver it
// returns the *cuda.LoadError (or the cuInit error); callers treat that as "no GPU".
func Open(pinDevice int) (*Backend, error) {
	drv, err := cuda.Open()
	if err != nil {
		return nil, err
	}
	return &Backend{drv: drv, pinDevice: pinDevice, devs: map[int]*cuda.Device{}}, nil
}

// Spec returns s with c as its device backend and host pinner (Spec.DeviceBackend,
// Spec.Pinner), for slab.OpenSet. A nil c returns s as it is.
func (c *Backend) Spec(s slab.Spec) slab.Spec {
	if c != nil {
		s.DeviceBackend, s.Pinner = c, c
	}
	return s
}

// Device returns device ordinal, retained by c until Close (for copies into slabs).
func (c *Backend) Device(ordinal int) (*cuda.Device, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%w: cuda backend", slab.ErrClosed)
	}
	if d := c.devs[ordinal]; d != nil {
		return d, nil
	}
	d, err := c.drv.Device(ordinal)
	if err != nil {
		return nil, err
	}
	c.devs[ordinal] = d
	return d, nil
}

type cudaBuffer struct{ b *cuda.DeviceBuffer }

func (r cudaBuffer) Ptr() uintptr { return uintptr(r.b.Ptr()) }
func (r cudaBuffer) Close() error { return r.b.Close() }

type cudaRegistration struct{ r *cuda.HostRegistration }

func (r cudaRegistration) Ptr() uintptr { return uintptr(r.r.DevicePtr()) }
func (r cudaRegistration) Close() error { return r.r.Close() }

// Alloc implements slab.DeviceBackend.
func (c *Backend) Alloc(device, size int) (slab.DeviceRegion, []byte, error) {
	d, err := c.Device(device)
	if err != nil {
		return nil, nil, err
	}
	b, err := d.Alloc(size)
	if err != nil {
		return nil, nil, err
	}
	h, err := b.IPCHandle()
	if err != nil {
		return nil, nil, errors.Join(err, b.Close())
	}
	text, _ := h.MarshalText()
	return cudaBuffer{b}, text, nil
}

// Open implements slab.DeviceBackend.
func (c *Backend) Open(device int, handle []byte, size int) (slab.DeviceRegion, error) {
	var h cuda.IPCMemHandle
	if err := h.UnmarshalText(handle); err != nil {
		return nil, err
	}
	d, err := c.Device(device)
	if err != nil {
		return nil, err
	}
	b, err := d.OpenIPC(h, size)
	if err != nil {
		return nil, err
	}
	return cudaBuffer{b}, nil
}

// Pin implements slab.HostPinner.
func (c *Backend) Pin(mem []byte) (slab.DeviceRegion, error) {
	d, err := c.Device(c.pinDevice)
	if err != nil {
		return nil, err
	}
	r, err := d.RegisterHost(mem)
	if err != nil {
		return nil, err
	}
	return cudaRegistration{r}, nil
}

// Close releases c's devices and the driver. Close every Set that used it first. Nil-safe and idempotent.
func (c *Backend) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, d := range c.devs {
		errs = append(errs, d.Close())
	}
	errs = append(errs, c.drv.Close())
	return errors.Join(errs...)
}
