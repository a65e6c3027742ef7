package cuda

/*
#include "cuda_api.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// EventFlags are cuEventCreate flags (CU_EVENT_*).
type EventFlags uint

// Event flags.
const (
	EventDefault       EventFlags = 0x0
	EventBlockingSync  EventFlags = 0x1
	EventDisableTiming EventFlags = 0x2
	// EventInterprocess makes the event shareable with IPCHandle; it requires
	// EventDisableTiming.
	EventInterprocess EventFlags = 0x4
)

// Event is a CUDA event: created here, or opened from another process's IPC handle.
type Event struct {
	dev   *Device
	h     unsafe.Pointer // CUevent
	flags EventFlags

	mu     sync.Mutex // protects closed
	closed bool
}

// NewEvent creates an event.
func (d *Device) NewEvent(flags EventFlags) (*Event, error) {
	if flags&EventInterprocess != 0 && flags&EventDisableTiming == 0 {
		return nil, fmt.Errorf("cuda: event flags 0x%x: interprocess events need EventDisableTiming", uint(flags))
	}
	if err := d.live(); err != nil {
		return nil, err
	}
	var h unsafe.Pointer
	if err := check(C.cp_cuEventCreate(d.ctx, &h, C.uint(flags)), callEventCreate, d.detail()); err != nil {
		return nil, err
	}
	return &Event{dev: d, h: h, flags: flags}, nil
}

// Close destroys the event. Nil-safe and idempotent.
func (e *Event) Close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return check(C.cp_cuEventDestroy(e.dev.ctx, e.h), callEventDestroy, e.dev.detail())
}

func (e *Event) live() error {
	if e == nil {
		return fmt.Errorf("cuda: nil event: %w", ErrClosed)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return fmt.Errorf("cuda: event: %w", ErrClosed)
	}
	return e.dev.live()
}

// Record captures the work enqueued on s so far.
func (e *Event) Record(s *Stream) error {
	if err := e.live(); err != nil {
		return err
	}
	if err := s.live(); err != nil {
		return err
	}
	return check(C.cp_cuEventRecord(e.dev.ctx, e.h, s.h), callEventRecord, e.dev.detail())
}

// Synchronize blocks until the captured work has completed.
func (e *Event) Synchronize() error {
	if err := e.live(); err != nil {
		return err
	}
	return check(C.cp_cuEventSynchronize(e.dev.ctx, e.h), callEventSync, e.dev.detail())
}

// Query reports whether the captured work has completed, without blocking.
func (e *Event) Query() (bool, error) {
	if err := e.live(); err != nil {
		return false, err
	}
	rc := C.cp_cuEventQuery(e.dev.ctx, e.h)
	if Result(rc) == ErrorNotReady {
		return false, nil
	}
	return rc == 0, check(rc, callEventQuery, e.dev.detail())
}

// Since returns the GPU time between start and e (both recorded, completed, with timing).
func (e *Event) Since(start *Event) (time.Duration, error) {
	if err := e.live(); err != nil {
		return 0, err
	}
	if err := start.live(); err != nil {
		return 0, err
	}
	var ms C.float
	if err := check(C.cp_cuEventElapsedTime(e.dev.ctx, &ms, start.h, e.h), callEventElapsed, e.dev.detail()); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// IPCHandle exports an interprocess event for OpenIPCEvent in another process.
func (e *Event) IPCHandle() (IPCEventHandle, error) {
	var h IPCEventHandle
	if e != nil && e.flags&EventInterprocess == 0 {
		return h, fmt.Errorf("cuda: event was created with flags 0x%x, not EventInterprocess", uint(e.flags))
	}
	if err := e.live(); err != nil {
		return h, err
	}
	err := check(C.cp_cuIpcGetEventHandle(e.dev.ctx, unsafe.Pointer(&h[0]), e.h), callIpcGetEvent, e.dev.detail())
	return h, err
}

// OpenIPCEvent opens an event exported by another process. Close destroys the local handle.
func (d *Device) OpenIPCEvent(h IPCEventHandle) (*Event, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	var ev unsafe.Pointer
	if err := check(C.cp_cuIpcOpenEventHandle(d.ctx, &ev, unsafe.Pointer(&h[0])), callIpcOpenEvent, d.detail()); err != nil {
		return nil, err
	}
	return &Event{dev: d, h: ev, flags: EventInterprocess | EventDisableTiming}, nil
}

// StreamWait makes the work enqueued later on stream, a raw CUstream (== cudaStream_t) of
// any library of this process on e's device (a torch stream's cuda_stream, Stream.Handle; 0
// the legacy default stream), wait until the work e captured at its last Record has
// completed. It returns at once: the host thread never waits (cuStreamWaitEvent). A later
// Record of e does not change what the stream waits for.
func (e *Event) StreamWait(stream uintptr) error {
	if err := e.live(); err != nil {
		return err
	}
	return check(C.cp_cuStreamWaitEventRaw(e.dev.ctx, C.uintptr_t(stream), e.h), callStreamWait, fmt.Sprintf("%s, stream 0x%x", e.dev.detail(), stream))
}
