package nccl

/*
#include "nccl_api.h"
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
)

// onDevice runs f on a locked OS thread with the device's primary context current, which is
// how NCCL's CUDA runtime learns the device. f must not block on other goroutines.
func (c *Comm) onDevice(f func() C.int) (C.int, error) {
	return onDevice(c.dev, f)
}

// onDeviceCheck runs f, the NCCL call named call on comm, with onDevice and checks its result.
func (c *Comm) onDeviceCheck(comm unsafe.Pointer, call string, f func() C.int) error {
	rc, err := c.onDevice(f)
	if err != nil {
		return err
	}
	return check(rc, call, "", comm)
}

func onDevice(dev *cuda.Device, f func() C.int) (C.int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := dev.MakeCurrent(); err != nil {
		return 0, err
	}
	return f(), nil
}

// onFreshThread runs f like onDevice, but on a new goroutine whose OS thread is retired when
// f returns an NCCL error (the goroutine exits with the thread still locked, so the Go
// runtime terminates the thread instead of reusing it). NCCL keeps its group state
// (ncclGroupDepth, ncclGroupBlocking, the queued jobs) in thread-local variables, and some
// of its error paths return from inside ncclGroupStartInternal without the matching
// ncclGroupEndInternal (2.28's ncclCommDestroy on a communicator that is not ready); on a
// reused thread every later NCCL call would then run inside that stale group. It is used for
// the calls that create, split, finalise, destroy and abort communicators; collectives,
// whose error paths leave the group correctly, run on the caller's thread (onDevice).
func onFreshThread(dev *cuda.Device, f func() C.int) (C.int, error) {
	type result struct {
		rc  C.int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := dev.MakeCurrent(); err != nil {
			runtime.UnlockOSThread()
			done <- result{0, err}
			return
		}
		rc := f()
		if r := Result(rc); r == Success || r == InProgress || int(rc)&notLoadedBit != 0 {
			runtime.UnlockOSThread()
		}
		done <- result{rc, nil}
	}()
	r := <-done
	return r.rc, r.err
}

// abortComm aborts comm (nil is a no-op) on a fresh thread with dev current. When dev cannot
// be made current (closed too early, or a driver error) the abort still happens, on a fresh
// thread that is then retired: an abort must happen either way, and it must not leave NCCL
// thread state, or the context some other code made current, on a thread Go reuses.
func abortComm(dev *cuda.Device, comm unsafe.Pointer) {
	if comm == nil {
		return
	}
	if _, err := onFreshThread(dev, func() C.int { return C.cp_ncclCommAbort(comm) }); err == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		C.cp_ncclCommAbort(comm)
		close(done)
	}()
	<-done
}
