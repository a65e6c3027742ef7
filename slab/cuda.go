package slab

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cpcache/cpcache/cuda"
)

// CUDA is the DeviceBackend and HostPinner over the CUDA driver: device slabs are cuMemAlloc
// allocations exported with cuIpcGetMemHandle and opened by peers with cuIpcOpenMemHandle;
// pinned host slabs are registered with cuMemHostRegister (portable, device-mapped).
//
// Open it with OpenCUDA, call Register to make OpenSet use it, and Close it after every Set
// that used it. A process cannot open its own IPC handles, so a CUDAIPC set needs one
// process per rank.
type CUDA struct {
	drv       *cuda.Driver
	pinDevice int

	mu         sync.Mutex // protects devs, closed, registered
	devs       map[int]*cuda.Device
	closed     bool
	registered bool
}

// OpenCUDA loads the CUDA driver. pinDevice is the device whose context registers pinned host
// slabs (registration is portable: every context sees it). On a machine without a driver it
// returns the *cuda.LoadError (or the cuInit error); callers treat that as "no GPU".
func OpenCUDA(pinDevice int) (*CUDA, error) {
	drv, err := cuda.Open()
	if err != nil {
		return nil, err
	}
	return &CUDA{drv: drv, pinDevice: pinDevice, devs: map[int]*cuda.Device{}}, nil
}

// Register installs c as this process's device backend and host pinner.
func (c *CUDA) Register() {
	c.mu.Lock()
	c.registered = true
	c.mu.Unlock()
	RegisterDeviceBackend(c)
	RegisterHostPinner(c)
}

// Device returns device ordinal, retained by c until Close (for copies into slabs).
func (c *CUDA) Device(ordinal int) (*cuda.Device, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%w: cuda backend", ErrClosed)
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

// Alloc implements DeviceBackend.
func (c *CUDA) Alloc(device, size int) (DeviceRegion, []byte, error) {
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

// Open implements DeviceBackend.
func (c *CUDA) Open(device int, handle []byte, size int) (DeviceRegion, error) {
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

// Pin implements HostPinner.
func (c *CUDA) Pin(mem []byte) (DeviceRegion, error) {
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

// Close unregisters c (when it is the registered backend), releases its devices and the
// driver. Close every Set that used it first. Nil-safe and idempotent.
func (c *CUDA) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.registered {
		backendsMu.Lock()
		if deviceBE == DeviceBackend(c) {
			deviceBE = nil
		}
		if pinner == HostPinner(c) {
			pinner = nil
		}
		backendsMu.Unlock()
	}
	var errs []error
	for _, d := range c.devs {
		errs = append(errs, d.Close())
	}
	errs = append(errs, c.drv.Close())
	return errors.Join(errs...)
}
