// Package cudaslab implements slab's DeviceBackend and HostPinner over the CUDA driver API
// (package cuda, loaded at run time): device slabs are cuMemAlloc allocations exported with
// cuIpcGetMemHandle and opened by peers with cuIpcOpenMemHandle; pinned host slabs are
// registered with cuMemHostRegister and addressed through their device pointer.
//
// It lives apart from slab so that slab, and everything above it up to the hicache driver,
// builds with CGO_ENABLED=0; only a process that wants GPU slabs links this package.
//
// Ownership: a Backend owns the driver handle and the devices it retained; Close it after
// every slab.Set that used it (nil-safe, idempotent). Usage:
//
//	be, err := cudaslab.Open(0) // an error on a machine without a driver: no GPU slabs
//	if err != nil { ... }
//	defer be.Close()
//	spec = be.Spec(spec) // a slab.Spec with Backend: slab.CUDAIPC or PinHost needs it
package cudaslab
