package cuda

/*
#include <stdlib.h>
#include "cuda_api.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// Stream is a CUDA stream (non-blocking with respect to the legacy default stream).
// Asynchronous copies are enqueued in order; Synchronize or an Event tells when they ran.
// Host memory given to an async copy must stay valid and unmodified (for HtoD) or untouched
// (for DtoH) until the stream has passed the copy; for the copy to overlap with the caller it
// must be pinned (HostBuffer or HostRegistration). Pageable Go memory is accepted: the driver
// then stages it before returning (HtoD) or completes the copy before returning (DtoH).
// A Stream is safe for concurrent use, but copies enqueued from several goroutines are
// ordered only by the order of the calls.
type Stream struct {
	dev *Device
	h   unsafe.Pointer // CUstream

	mu       sync.Mutex // protects closed and batchErr
	closed   bool
	batchErr error // the batch call's run-time failure: later batches go copy by copy
}

// NewStream creates a stream on the device.
func (d *Device) NewStream() (*Stream, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	var h unsafe.Pointer
	if err := check(C.cp_cuStreamCreate(d.ctx, &h, C.CP_CU_STREAM_NON_BLOCKING), callStreamCreate, d.detail()); err != nil {
		return nil, err
	}
	return &Stream{dev: d, h: h}, nil
}

// Handle is the raw CUstream (== cudaStream_t), for other CUDA libraries such as NCCL.
func (s *Stream) Handle() uintptr { return uintptr(s.h) }

// Device is the stream's device.
func (s *Stream) Device() *Device { return s.dev }

// Close waits for the stream's work and destroys it. Nil-safe and idempotent.
func (s *Stream) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	syncErr := check(C.cp_cuStreamSynchronize(s.dev.ctx, s.h), callStreamSync, s.dev.detail())
	if err := check(C.cp_cuStreamDestroy(s.dev.ctx, s.h), callStreamDestroy, s.dev.detail()); err != nil {
		return err
	}
	return syncErr
}

func (s *Stream) live() error {
	if s == nil {
		return fmt.Errorf("cuda: nil stream: %w", ErrClosed)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("cuda: stream: %w", ErrClosed)
	}
	return s.dev.live()
}

// ready reports whether an operation on n bytes is to be enqueued: false with an error for a
// negative size or a closed stream, false with none for n == 0 (nothing to do).
func (s *Stream) ready(op string, n int) (bool, error) {
	if n < 0 {
		return false, fmt.Errorf("cuda: %s: negative size %d", op, n)
	}
	if n == 0 {
		return false, nil
	}
	if err := s.live(); err != nil {
		return false, err
	}
	return true, nil
}

// Synchronize blocks until all work enqueued so far has completed. It cannot be
// interrupted; callers that need a deadline poll Query instead.
func (s *Stream) Synchronize() error {
	if err := s.live(); err != nil {
		return err
	}
	return check(C.cp_cuStreamSynchronize(s.dev.ctx, s.h), callStreamSync, s.dev.detail())
}

// Query reports whether all work enqueued so far has completed, without blocking.
func (s *Stream) Query() (bool, error) {
	if err := s.live(); err != nil {
		return false, err
	}
	rc := C.cp_cuStreamQuery(s.dev.ctx, s.h)
	if Result(rc) == ErrorNotReady {
		return false, nil
	}
	if rc != 0 {
		return false, check(rc, callStreamQuery, s.dev.detail())
	}
	return true, nil
}

// WaitEvent makes later work on s wait until e has completed (on any stream or process).
func (s *Stream) WaitEvent(e *Event) error {
	if err := s.live(); err != nil {
		return err
	}
	if err := e.live(); err != nil {
		return err
	}
	return check(C.cp_cuStreamWaitEvent(s.dev.ctx, s.h, e.h), callStreamWait, s.dev.detail())
}

// CopyHtoD enqueues a copy of src to device address dst.
func (s *Stream) CopyHtoD(dst DevicePtr, src []byte) error {
	if ok, err := s.ready("copy", len(src)); !ok {
		return err
	}
	if rc := C.cp_cuMemcpyHtoDAsync(s.dev.ctx, C.cp_CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), s.h); rc != 0 {
		return check(rc, callHtoDAsync, fmt.Sprintf("%s, %d bytes to %v", s.dev.detail(), len(src), dst))
	}
	return nil
}

// CopyDtoH enqueues a copy of len(dst) bytes from device address src into dst.
func (s *Stream) CopyDtoH(dst []byte, src DevicePtr) error {
	if ok, err := s.ready("copy", len(dst)); !ok {
		return err
	}
	if rc := C.cp_cuMemcpyDtoHAsync(s.dev.ctx, unsafe.Pointer(&dst[0]), C.cp_CUdeviceptr(src), C.size_t(len(dst)), s.h); rc != 0 {
		return check(rc, callDtoHAsync, fmt.Sprintf("%s, %d bytes from %v", s.dev.detail(), len(dst), src))
	}
	return nil
}

// CopyDtoD enqueues a device-to-device copy of n bytes.
func (s *Stream) CopyDtoD(dst, src DevicePtr, n int) error {
	if ok, err := s.ready("copy", n); !ok {
		return err
	}
	if rc := C.cp_cuMemcpyDtoDAsync(s.dev.ctx, C.cp_CUdeviceptr(dst), C.cp_CUdeviceptr(src), C.size_t(n), s.h); rc != 0 {
		return check(rc, callDtoDAsync, fmt.Sprintf("%s, %d bytes %v -> %v", s.dev.detail(), n, src, dst))
	}
	return nil
}

// Copy enqueues a copy of n bytes between unified addresses in any direction (device
// memory, or pinned host memory through HostBuffer/HostRegistration.DevicePtr).
func (s *Stream) Copy(dst, src DevicePtr, n int) error {
	if ok, err := s.ready("copy", n); !ok {
		return err
	}
	if rc := C.cp_cuMemcpyAsync(s.dev.ctx, C.cp_CUdeviceptr(dst), C.cp_CUdeviceptr(src), C.size_t(n), s.h); rc != 0 {
		return check(rc, callMemcpyAsync, fmt.Sprintf("%s, %d bytes %v -> %v", s.dev.detail(), n, src, dst))
	}
	return nil
}

// CopyBandwidth times tries copies of n bytes from src to dst, each waited for, and returns
// the best rate in GB/s (the bus's bandwidth for large copies; a baseline for page copies).
func (s *Stream) CopyBandwidth(dst, src DevicePtr, n, tries int) (float64, error) {
	var best float64
	for range tries {
		start := time.Now()
		if err := s.Copy(dst, src, n); err != nil {
			return 0, err
		}
		if err := s.Synchronize(); err != nil {
			return 0, err
		}
		best = max(best, float64(n)/time.Since(start).Seconds()/1e9)
	}
	return best, nil
}

// Memset enqueues setting n bytes at dst to v.
func (s *Stream) Memset(dst DevicePtr, v byte, n int) error {
	if ok, err := s.ready("memset", n); !ok {
		return err
	}
	if rc := C.cp_cuMemsetD8Async(s.dev.ctx, C.cp_CUdeviceptr(dst), C.uchar(v), C.size_t(n), s.h); rc != 0 {
		return check(rc, callMemsetAsync, s.dev.detail())
	}
	return nil
}

// Copy1 is one copy of a batch: Size bytes from Src to Dst, unified addresses.
type Copy1 struct {
	Dst, Src DevicePtr
	Size     int
}

// CopyBatch enqueues copies that may run in any order relative to each other (they must not
// overlap or depend on one another); as a whole they run in stream order. With a driver
// that has cuMemcpyBatchAsync (CUDA >= 12.8, see Driver.BatchCopyABI) the batch is one
// driver call; otherwise each copy is enqueued with cuMemcpyAsync. When the batch call fails
// at run time, the copies are enqueued one by one instead and the stream stays per-copy
// (BatchError says why). It returns whether the driver's batch call was used.
func (s *Stream) CopyBatch(copies []Copy1) (batched bool, err error) {
	if err := validBatch(copies); err != nil {
		return false, err
	}
	if len(copies) == 0 {
		return false, nil
	}
	if err := s.live(); err != nil {
		return false, err
	}
	abi := s.dev.drv.BatchCopyABI()
	if abi == "" || s.BatchError() != nil {
		return false, s.CopyEach(copies)
	}
	n := len(copies)
	// One C allocation for the three arrays: the driver reads them during the call only.
	mem := C.malloc(C.size_t(3 * 8 * n))
	defer C.free(mem)
	arr := unsafe.Slice((*uint64)(mem), 3*n)
	dsts, srcs, sizes := arr[:n], arr[n:2*n], arr[2*n:]
	for i, c := range copies {
		dsts[i], srcs[i], sizes[i] = uint64(c.Dst), uint64(c.Src), uint64(c.Size)
	}
	var fail C.size_t
	rc := C.cp_cuMemcpyBatch(s.dev.ctx, (*C.cp_CUdeviceptr)(unsafe.Pointer(&dsts[0])),
		(*C.cp_CUdeviceptr)(unsafe.Pointer(&srcs[0])), (*C.size_t)(unsafe.Pointer(&sizes[0])),
		C.size_t(n), s.h, &fail)
	if rc == 0 {
		return true, nil
	}
	detail := fmt.Sprintf("%s, %d copies", s.dev.detail(), n)
	if uint64(fail) < uint64(n) {
		c := copies[fail]
		detail += fmt.Sprintf(", failed at copy %d: %d bytes %v -> %v", uint64(fail), c.Size, c.Src, c.Dst)
	}
	// The batch call failed at run time (a driver that rejects the attributes, say): enqueue
	// the copies one by one — copies the batch may have enqueued are repeated with the same
	// bytes, in stream order — and use per-copy for this stream from now on.
	batchErr := check(rc, abi, detail)
	if err := s.CopyEach(copies); err != nil {
		return false, errors.Join(batchErr, err)
	}
	s.mu.Lock()
	s.batchErr = batchErr
	s.mu.Unlock()
	return false, nil
}

// BatchError is the failure of the driver's batch call that made CopyBatch fall back to
// per-copy for this stream, or nil.
func (s *Stream) BatchError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batchErr
}

// CopyEach enqueues the copies one by one with cuMemcpyAsync (the batch fallback).
func (s *Stream) CopyEach(copies []Copy1) error {
	if err := validBatch(copies); err != nil {
		return err
	}
	for i, c := range copies {
		if err := s.Copy(c.Dst, c.Src, c.Size); err != nil {
			return fmt.Errorf("cuda: batch copy %d of %d: %w", i, len(copies), err)
		}
	}
	return nil
}

func validBatch(copies []Copy1) error {
	for i, c := range copies {
		if c.Size <= 0 {
			return fmt.Errorf("cuda: batch copy %d: size %d must be positive", i, c.Size)
		}
	}
	return nil
}
