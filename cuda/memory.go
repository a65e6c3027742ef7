package cuda

/*
#include "cuda_api.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// DevicePtr is an address in the device's (unified) address space. It is its own type so
// host memory ([]byte) and device memory cannot be mixed up; pinned host memory has a
// DevicePtr too (HostBuffer.DevicePtr), which batched and any-direction copies take.
type DevicePtr uint64

// Add offsets p by n bytes.
func (p DevicePtr) Add(n int) DevicePtr { return p + DevicePtr(n) }

func (p DevicePtr) String() string { return fmt.Sprintf("0x%x", uint64(p)) }

// Host-allocation and registration flags (cuda.h CU_MEMHOSTALLOC_* / CU_MEMHOSTREGISTER_*).
const (
	hostAllocPortable  = 0x01
	hostAllocDeviceMap = 0x02
	hostRegPortable    = 0x01
	hostRegDeviceMap   = 0x02
)

// DeviceBuffer is device memory: allocated by Alloc (freed by Close) or mapped from another
// process by OpenIPC (unmapped by Close). Close it before its Device.
type DeviceBuffer struct {
	dev    *Device
	ptr    DevicePtr
	size   int
	opened bool // mapped from an IPC handle, not allocated here

	mu     sync.Mutex // protects closed
	closed bool
}

// Alloc allocates size bytes of device memory (cuMemAlloc_v2; 256-byte aligned).
func (d *Device) Alloc(size int) (*DeviceBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: alloc: size %d must be positive", size)
	}
	if err := d.live(); err != nil {
		return nil, err
	}
	var p C.cp_CUdeviceptr
	if err := check(C.cp_cuMemAlloc(d.ctx, &p, C.size_t(size)), callMemAlloc, fmt.Sprintf("%s, %d bytes", d.detail(), size)); err != nil {
		return nil, err
	}
	return &DeviceBuffer{dev: d, ptr: DevicePtr(p), size: size}, nil
}

// Ptr is the buffer's device address.
func (b *DeviceBuffer) Ptr() DevicePtr { return b.ptr }

// Size is the buffer's length in bytes.
func (b *DeviceBuffer) Size() int { return b.size }

// Device is the device the buffer lives on (or, for an IPC mapping, is mapped into).
func (b *DeviceBuffer) Device() *Device { return b.dev }

// Close frees (or, for an IPC mapping, unmaps) the memory. Nil-safe and idempotent.
func (b *DeviceBuffer) Close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if b.opened {
		return check(C.cp_cuIpcCloseMemHandle(b.dev.ctx, C.cp_CUdeviceptr(b.ptr)), callIpcCloseMem, b.dev.detail())
	}
	return check(C.cp_cuMemFree(b.dev.ctx, C.cp_CUdeviceptr(b.ptr)), callMemFree, b.dev.detail())
}

func (b *DeviceBuffer) live() error {
	if b == nil {
		return fmt.Errorf("cuda: nil device buffer: %w", ErrClosed)
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return fmt.Errorf("cuda: device buffer %v: %w", b.ptr, ErrClosed)
	}
	return b.dev.live()
}

func (b *DeviceBuffer) span(off, n int) error {
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return fmt.Errorf("cuda: range [%d, %d+%d) outside buffer of %d bytes", off, off, n, b.size)
	}
	return nil
}

// Write copies src to the buffer at byte offset off and returns when src may be reused
// (cuMemcpyHtoD_v2).
func (b *DeviceBuffer) Write(off int, src []byte) error {
	if err := b.span(off, len(src)); err != nil {
		return err
	}
	if err := b.live(); err != nil {
		return err
	}
	return b.dev.CopyHtoD(b.ptr.Add(off), src)
}

// Read copies len(dst) bytes from byte offset off into dst, synchronously (cuMemcpyDtoH_v2).
func (b *DeviceBuffer) Read(off int, dst []byte) error {
	if err := b.span(off, len(dst)); err != nil {
		return err
	}
	if err := b.live(); err != nil {
		return err
	}
	return b.dev.CopyDtoH(dst, b.ptr.Add(off))
}

// Fill sets every byte of the buffer to v, synchronously.
func (b *DeviceBuffer) Fill(v byte) error {
	if err := b.live(); err != nil {
		return err
	}
	return check(C.cp_cuMemsetD8(b.dev.ctx, C.cp_CUdeviceptr(b.ptr), C.uchar(v), C.size_t(b.size)), callMemset, b.dev.detail())
}

// CopyHtoD copies src to device address dst synchronously with respect to src: when it
// returns, src may be reused.
func (d *Device) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := d.live(); err != nil {
		return err
	}
	if rc := C.cp_cuMemcpyHtoD(d.ctx, C.cp_CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))); rc != 0 {
		return check(rc, callHtoD, fmt.Sprintf("%s, %d bytes to %v", d.detail(), len(src), dst))
	}
	return nil
}

// CopyDtoH copies len(dst) bytes from device address src into dst and waits for the copy.
func (d *Device) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := d.live(); err != nil {
		return err
	}
	if rc := C.cp_cuMemcpyDtoH(d.ctx, unsafe.Pointer(&dst[0]), C.cp_CUdeviceptr(src), C.size_t(len(dst))); rc != 0 {
		return check(rc, callDtoH, fmt.Sprintf("%s, %d bytes from %v", d.detail(), len(dst), src))
	}
	return nil
}

// CopyDtoD copies n bytes between device addresses (cuMemcpyDtoD_v2).
func (d *Device) CopyDtoD(dst, src DevicePtr, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: copy: negative size %d", n)
	}
	if n == 0 {
		return nil
	}
	if err := d.live(); err != nil {
		return err
	}
	if rc := C.cp_cuMemcpyDtoD(d.ctx, C.cp_CUdeviceptr(dst), C.cp_CUdeviceptr(src), C.size_t(n)); rc != 0 {
		return check(rc, callDtoD, fmt.Sprintf("%s, %d bytes %v -> %v", d.detail(), n, src, dst))
	}
	return nil
}

// HostBuffer is page-locked host memory allocated by the driver (cuMemHostAlloc, portable
// and device-mapped). Its bytes are C memory, never moved or collected by Go, so they can be
// the source or target of asynchronous copies. Close it before its Device.
type HostBuffer struct {
	dev  *Device
	ptr  unsafe.Pointer
	size int
	dptr DevicePtr

	mu     sync.Mutex // protects closed
	closed bool
}

// AllocHost allocates size bytes of pinned host memory usable by every context.
func (d *Device) AllocHost(size int) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: alloc host: size %d must be positive", size)
	}
	if err := d.live(); err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	if err := check(C.cp_cuMemHostAlloc(d.ctx, &p, C.size_t(size), hostAllocPortable|hostAllocDeviceMap),
		callHostAlloc, fmt.Sprintf("%s, %d bytes", d.detail(), size)); err != nil {
		return nil, err
	}
	var dp C.cp_CUdeviceptr
	if err := check(C.cp_cuMemHostGetDevicePointer(d.ctx, &dp, C.uintptr_t(uintptr(p))), callHostDevPtr, d.detail()); err != nil {
		C.cp_cuMemFreeHost(d.ctx, p)
		return nil, err
	}
	return &HostBuffer{dev: d, ptr: p, size: size, dptr: DevicePtr(dp)}, nil
}

// Bytes is the memory as a slice; it must not be used after Close.
func (h *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(h.ptr), h.size) }

// DevicePtr is the memory's address in the unified address space, for Copy and CopyBatch.
func (h *HostBuffer) DevicePtr() DevicePtr { return h.dptr }

// Size is the length in bytes.
func (h *HostBuffer) Size() int { return h.size }

// Close frees the memory. Nil-safe and idempotent.
func (h *HostBuffer) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	return check(C.cp_cuMemFreeHost(h.dev.ctx, h.ptr), callFreeHost, h.dev.detail())
}

// HostRegistration is existing host memory (e.g. a mmap'd shared-memory slab) page-locked
// and mapped for the device with cuMemHostRegister_v2 (portable, device-mapped). Close
// unregisters it; the memory itself stays owned by the caller.
type HostRegistration struct {
	dev  *Device
	mem  []byte
	dptr DevicePtr

	mu     sync.Mutex // protects closed
	closed bool
}

// RegisterHost pins mem for asynchronous copies. mem must not be Go-heap memory (the Go
// runtime may reuse it after it is unreachable): use mmap'd or C memory, and keep it mapped
// until the registration is closed. Page-aligned regions are registered most efficiently.
func (d *Device) RegisterHost(mem []byte) (*HostRegistration, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("cuda: register host: empty region")
	}
	if err := d.live(); err != nil {
		return nil, err
	}
	addr := uintptr(unsafe.Pointer(&mem[0]))
	detail := fmt.Sprintf("%s, %d bytes at 0x%x", d.detail(), len(mem), addr)
	if err := check(C.cp_cuMemHostRegister(d.ctx, C.uintptr_t(addr), C.size_t(len(mem)), hostRegPortable|hostRegDeviceMap), callHostRegister, detail); err != nil {
		return nil, err
	}
	var dp C.cp_CUdeviceptr
	if err := check(C.cp_cuMemHostGetDevicePointer(d.ctx, &dp, C.uintptr_t(addr)), callHostDevPtr, detail); err != nil {
		C.cp_cuMemHostUnregister(d.ctx, C.uintptr_t(addr))
		return nil, err
	}
	return &HostRegistration{dev: d, mem: mem, dptr: DevicePtr(dp)}, nil
}

// Bytes is the registered region.
func (r *HostRegistration) Bytes() []byte { return r.mem }

// DevicePtr is the region's address in the unified address space.
func (r *HostRegistration) DevicePtr() DevicePtr { return r.dptr }

// Close unregisters the region. Nil-safe and idempotent.
func (r *HostRegistration) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	return check(C.cp_cuMemHostUnregister(r.dev.ctx, C.uintptr_t(uintptr(unsafe.Pointer(&r.mem[0])))), callHostUnregister, r.dev.detail())
}
