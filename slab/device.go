package slab

import (
	"fmt"
	"sync"
)

// DeviceRegion is device memory seen by this process: a slab allocated here, or a peer's slab
// opened from its IPC handle.
type DeviceRegion interface {
	// Ptr is the device address of the first byte.
	Ptr() uintptr
	// Close frees (own) or closes (peer) the memory; it is idempotent.
	Close() error
}

// DeviceBackend allocates device memory exportable with CUDA IPC and opens peers' exports.
// The cuda package provides one; tests may register a fake.
type DeviceBackend interface {
	// Alloc allocates size bytes on device and returns it with its IPC handle.
	Alloc(device, size int) (DeviceRegion, []byte, error)
	// Open opens a peer's allocation of size bytes from its IPC handle on device.
	Open(device int, handle []byte, size int) (DeviceRegion, error)
}

// HostPinner registers host memory with CUDA as pinned (page-locked) memory.
type HostPinner interface {
	// Pin registers mem; the region's Ptr is mem's device-visible address and its Close
	// unregisters it.
	Pin(mem []byte) (DeviceRegion, error)
}

var (
	backendsMu sync.Mutex    // protects deviceBE and pinner
	deviceBE   DeviceBackend // nil: CUDAIPC is unsupported in this process
	pinner     HostPinner    // nil: Spec.PinHost is ignored
)

// RegisterDeviceBackend installs the CUDA IPC backend (nil removes it). Call it before
// OpenSet, typically once a CUDA driver was found.
func RegisterDeviceBackend(b DeviceBackend) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	deviceBE = b
}

// RegisterHostPinner installs the pinned-memory registrar used for Spec.PinHost (nil removes
// it; PinHost is then ignored).
func RegisterHostPinner(p HostPinner) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	pinner = p
}

// UnregisterBackends removes b and p where they are the registered backends (a backend's
// Close calls it; another registration made since is left alone).
func UnregisterBackends(b DeviceBackend, p HostPinner) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if deviceBE == b {
		deviceBE = nil
	}
	if pinner == p {
		pinner = nil
	}
}

func currentBackends() (DeviceBackend, HostPinner) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	return deviceBE, pinner
}

func errNoDeviceBackend() error {
	return fmt.Errorf("%w: backend %q needs a CUDA driver and a registered device backend", ErrUnsupported, CUDAIPC)
}
