package slab

import "fmt"

// DeviceRegion is device memory seen by this process: a slab allocated here, or a peer's slab
// opened from its IPC handle.
type DeviceRegion interface {
	// Ptr is the device address of the first byte.
	Ptr() uintptr
	// Close frees (own) or closes (peer) the memory; it is idempotent.
	Close() error
}

// DeviceBackend allocates device memory exportable with CUDA IPC and opens peers' exports.
// slab/cudaslab provides one (over the CUDA driver); tests may use a fake. A Spec names it
// (Spec.DeviceBackend).
type DeviceBackend interface {
	// Alloc allocates size bytes on device and returns it with its IPC handle.
	Alloc(device, size int) (DeviceRegion, []byte, error)
	// Open opens a peer's allocation of size bytes from its IPC handle on device.
	Open(device int, handle []byte, size int) (DeviceRegion, error)
}

// HostPinner registers host memory with CUDA as pinned (page-locked) memory. slab/cudaslab
// provides one; a Spec names it (Spec.Pinner).
type HostPinner interface {
	// Pin registers mem; the region's Ptr is mem's device-visible address and its Close
	// unregisters it.
	Pin(mem []byte) (DeviceRegion, error)
}

func errNoDeviceBackend() error {
	return fmt.Errorf("%w: backend %q needs a CUDA driver: Spec.DeviceBackend is nil (slab/cudaslab provides one)", ErrUnsupported, CUDAIPC)
}
