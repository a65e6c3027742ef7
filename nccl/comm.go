package nccl

/*
#include "nccl_api.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/parallel"
)

// Options tune a communicator.
type Options struct {
	// Timeout bounds initialisation and every Wait whose context has no earlier deadline
	// (default parallel.DefaultTimeout). When it passes the communicator is aborted.
	Timeout time.Duration
	// Blocking asks for a blocking communicator even when NCCL supports non-blocking ones
	// (>= 2.14). Non-blocking is the default: it lets a stuck initialisation or collective
	// be abandoned at the deadline instead of hanging the caller.
	Blocking bool
}

// Comm is an NCCL communicator on one device. Collectives enqueue work on a cuda.Stream and
// return; Wait polls the stream and the communicator's asynchronous error until the deadline,
// then aborts. A Comm is used by one goroutine at a time (like parallel.Group); Abort may be
// called from any goroutine.
type Comm struct {
	lib         *Library
	dev         *cuda.Device
	rank, size  int
	nonBlocking bool
	timeout     time.Duration

	mu     sync.Mutex     // protects comm and failed
	comm   unsafe.Pointer // ncclComm_t; nil after Close or Abort
	failed error          // why the communicator was aborted (sticky)
}

// NewComm creates a communicator over the members of group, one per member, on dev: rank 0
// asks NCCL for a unique id and broadcasts it over group (a CPU group: Gloo, shared memory or
// in-process), then every member initialises. It returns when initialisation completed on
// this member, or fails by the deadline (ctx, or opts.Timeout).
func NewComm(ctx context.Context, group parallel.Group, dev *cuda.Device, opts Options) (*Comm, error) {
	if group == nil || dev == nil {
		return nil, fmt.Errorf("nccl: new comm: nil group or device")
	}
	lib, err := Open()
	if err != nil {
		return nil, err
	}
	var id UniqueID
	if group.Rank() == 0 {
		if id, err = lib.NewUniqueID(); err != nil {
			lib.Close()
			return nil, err
		}
	}
	got, err := group.Broadcast(ctx, 0, id[:])
	if err != nil {
		lib.Close()
		return nil, fmt.Errorf("nccl: broadcast unique id on %s: %w", group.Name(), err)
	}
	if len(got) != UniqueIDSize {
		lib.Close()
		return nil, fmt.Errorf("nccl: unique id from rank 0 of %s has %d bytes, want %d", group.Name(), len(got), UniqueIDSize)
	}
	copy(id[:], got)
	c, err := lib.InitRank(ctx, dev, id, group.Rank(), group.Size(), opts)
	lib.Close() // the Comm holds its own reference
	return c, err
}

// InitRank creates this member's communicator from an id every member shares.
func (l *Library) InitRank(ctx context.Context, dev *cuda.Device, id UniqueID, rank, size int, opts Options) (*Comm, error) {
	if size <= 0 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("nccl: init rank %d of %d: out of range", rank, size)
	}
	if dev == nil {
		return nil, fmt.Errorf("nccl: init rank %d of %d: nil device", rank, size)
	}
	if err := l.live(); err != nil {
		return nil, err
	}
	// The Comm keeps its own library reference.
	own, err := Open()
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 {
		opts.Timeout = parallel.DefaultTimeout
	}
	c := &Comm{lib: own, dev: dev, rank: rank, size: size, timeout: opts.Timeout,
		nonBlocking: !opts.Blocking && own.Supports("config")}
	detail := fmt.Sprintf("rank %d of %d, device %d", rank, size, dev.Ordinal())
	if c.nonBlocking {
		slot := C.cp_nccl_slot_new()
		if slot == nil {
			own.Close()
			return nil, fmt.Errorf("nccl: init %s: out of memory", detail)
		}
		defer C.cp_nccl_slot_free(slot) // every path below has completed or aborted the init
		rc, err := onFreshThread(dev, func() C.int {
			return C.cp_ncclCommInitRankConfig(slot, C.int(size), unsafe.Pointer(&id[0]), C.int(rank), 0)
		})
		comm := C.cp_nccl_slot_load(slot)
		if err == nil && Result(rc) != InProgress {
			err = check(rc, "ncclCommInitRankConfig", detail, comm)
		}
		if err != nil {
			abortComm(dev, comm)
			own.Close()
			return nil, err
		}
		C.cp_nccl_keep() // NCCL threads now exist
		c.comm = comm
		if err := c.waitReady(ctx, comm, "ncclCommInitRankConfig", detail); err != nil {
			own.Close()
			return nil, err
		}
		return c, nil
	}
	// Blocking initialisation: run it aside so the caller gets its deadline. On a timeout the
	// initialising thread is abandoned (NCCL offers no way to interrupt it), and so is its
	// out-slot, which NCCL may still write.
	type result struct {
		comm unsafe.Pointer
		err  error
	}
	slot := C.cp_nccl_slot_new()
	if slot == nil {
		own.Close()
		return nil, fmt.Errorf("nccl: init %s: out of memory", detail)
	}
	done := make(chan result, 1)
	C.cp_nccl_keep()
	go func() {
		rc, err := onFreshThread(dev, func() C.int {
			return C.cp_ncclCommInitRank(slot, C.int(size), unsafe.Pointer(&id[0]), C.int(rank))
		})
		comm := C.cp_nccl_slot_load(slot)
		if err == nil {
			err = check(rc, "ncclCommInitRank", detail, comm)
		}
		C.cp_nccl_slot_free(slot)
		done <- result{comm, err}
	}()
	deadline := parallel.Deadline(ctx, opts.Timeout)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			own.Close()
			return nil, r.err
		}
		c.comm = r.comm
		return c, nil
	case <-timer.C:
		own.Close()
		return nil, timeoutError(ctx, "ncclCommInitRank", detail, opts.Timeout)
	}
}

func timeoutError(ctx context.Context, call, detail string, timeout time.Duration) error {
	if ctx.Err() != nil {
		return fmt.Errorf("nccl: %s (%s): %w: %w", call, detail, parallel.ErrTimeout, ctx.Err())
	}
	return fmt.Errorf("nccl: %s (%s) did not complete within %v: %w", call, detail, timeout, parallel.ErrTimeout)
}

// pollAsync polls comm's ncclCommGetAsyncError while it reports ncclInProgress, until the
// deadline (ctx, else timeout). A non-blocking communicator must not be used (not even
// finalised or destroyed) before this returned nil: NCCL's ncclCommEnsureReady rejects it
// with "Attempt to use communicator before the previous operation returned ncclSuccess".
//
// NCCL asks the CUDA runtime for the calling thread's device in ncclCommGetAsyncError, so the
// poll runs on a locked OS thread with dev's context current.
func pollAsync(ctx context.Context, dev *cuda.Device, comm unsafe.Pointer, timeout time.Duration, call, detail string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := dev.MakeCurrent(); err != nil {
		return fmt.Errorf("nccl: %s (%s): %w", call, detail, err)
	}
	deadline := parallel.Deadline(ctx, timeout)
	for pause := time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
		var st C.int
		if err := check(C.cp_ncclCommGetAsyncError(comm, &st), "ncclCommGetAsyncError", detail, comm); err != nil {
			return err
		}
		switch Result(st) {
		case Success:
			return nil
		case InProgress:
		default:
			return check(st, call, detail, comm)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return timeoutError(ctx, call, detail, timeout)
		}
		time.Sleep(pause)
	}
}

// waitReady is pollAsync that aborts the communicator on failure or at the deadline.
func (c *Comm) waitReady(ctx context.Context, comm unsafe.Pointer, call, detail string) error {
	if err := pollAsync(ctx, c.dev, comm, c.timeout, call, detail); err != nil {
		return c.fail(err)
	}
	return nil
}

// fail aborts the communicator and records why; later calls return the recorded error.
func (c *Comm) fail(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	if c.comm != nil {
		abortComm(c.dev, c.comm)
		c.comm = nil
	}
	return err
}

// handle returns the live ncclComm_t or why there is none.
func (c *Comm) handle() (unsafe.Pointer, error) {
	if c == nil {
		return nil, ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed != nil {
		return nil, c.failed
	}
	if c.comm == nil {
		return nil, ErrClosed
	}
	return c.comm, nil
}

// Rank is this member's rank in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device is the communicator's device.
func (c *Comm) Device() *cuda.Device { return c.dev }

// NonBlocking reports whether the communicator was created non-blocking (NCCL >= 2.14).
func (c *Comm) NonBlocking() bool { return c.nonBlocking }

// Library is the NCCL library the communicator uses.
func (c *Comm) Library() *Library { return c.lib }

// Query returns the communicator's count, CUDA device and rank as NCCL reports them.
func (c *Comm) Query() (count, device, rank int, err error) {
	comm, err := c.handle()
	if err != nil {
		return 0, 0, 0, err
	}
	var n, d, r C.int
	for _, q := range []struct {
		call string
		f    func() C.int
	}{
		{"ncclCommCount", func() C.int { return C.cp_ncclCommCount(comm, &n) }},
		{"ncclCommCuDevice", func() C.int { return C.cp_ncclCommCuDevice(comm, &d) }},
		{"ncclCommUserRank", func() C.int { return C.cp_ncclCommUserRank(comm, &r) }},
	} {
		if err := c.onDeviceCheck(comm, q.call, q.f); err != nil {
			return 0, 0, 0, err
		}
	}
	return int(n), int(d), int(r), nil
}

// AsyncError returns the communicator's asynchronous error, nil when healthy or still in
// progress.
func (c *Comm) AsyncError() error {
	comm, err := c.handle()
	if err != nil {
		return err
	}
	var st C.int
	if err := c.onDeviceCheck(comm, "ncclCommGetAsyncError", func() C.int { return C.cp_ncclCommGetAsyncError(comm, &st) }); err != nil {
		return err
	}
	if Result(st) == Success || Result(st) == InProgress {
		return nil
	}
	return check(st, "asynchronous error", c.who(), comm)
}

// who names this member in error details: "rank R of N".
func (c *Comm) who() string { return fmt.Sprintf("rank %d of %d", c.rank, c.size) }

// enqueue issues one NCCL call that takes the communicator and finishes a non-blocking
// in-progress state before returning. detail describes the call for errors; it is only
// formatted when one is returned or the call is in progress, not on every collective.
func (c *Comm) enqueue(ctx context.Context, call string, detail func() string, f func(comm unsafe.Pointer) C.int) error {
	comm, err := c.handle()
	if err != nil {
		return err
	}
	rc, err := c.onDevice(func() C.int { return f(comm) })
	if err != nil {
		return err
	}
	switch Result(rc) {
	case Success:
		return nil
	case InProgress:
		return c.waitReady(ctx, comm, call, detail())
	}
	return check(rc, call, detail(), comm)
}

func checkArgs(count int, dt DataType, op RedOp, needOp bool) error {
	if count < 0 {
		return fmt.Errorf("nccl: negative count %d", count)
	}
	if !dt.Valid() {
		return fmt.Errorf("nccl: unknown data type %d", int(dt))
	}
	if needOp && !op.Valid() {
		return fmt.Errorf("nccl: unknown reduction %d", int(op))
	}
	return nil
}

// AllReduce enqueues recv[i] = op over ranks of send[i], count elements of dt, on s.
// send == recv is an in-place reduction.
func (c *Comm) AllReduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt DataType, op RedOp, s *cuda.Stream) error {
	if err := checkArgs(count, dt, op, true); err != nil {
		return err
	}
	return c.enqueue(ctx, "ncclAllReduce", func() string { return fmt.Sprintf("%d x %v %v", count, dt, op) }, func(comm unsafe.Pointer) C.int {
		return C.cp_ncclAllReduce(C.uint64_t(send), C.uint64_t(recv), C.size_t(count), C.int(dt), C.int(op), comm, C.uintptr_t(s.Handle()))
	})
}

// Broadcast enqueues copying root's send buffer into every rank's recv buffer.
func (c *Comm) Broadcast(ctx context.Context, send, recv cuda.DevicePtr, count int, dt DataType, root int, s *cuda.Stream) error {
	if err := checkArgs(count, dt, 0, false); err != nil {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("nccl: broadcast root %d out of range [0, %d)", root, c.size)
	}
	return c.enqueue(ctx, "ncclBroadcast", func() string { return fmt.Sprintf("%d x %v from %d", count, dt, root) }, func(comm unsafe.Pointer) C.int {
		return C.cp_ncclBroadcast(C.uint64_t(send), C.uint64_t(recv), C.size_t(count), C.int(dt), C.int(root), comm, C.uintptr_t(s.Handle()))
	})
}

// AllGather enqueues gathering sendCount elements from every rank into recv, rank-major
// (recv holds Size()*sendCount elements).
func (c *Comm) AllGather(ctx context.Context, send, recv cuda.DevicePtr, sendCount int, dt DataType, s *cuda.Stream) error {
	if err := checkArgs(sendCount, dt, 0, false); err != nil {
		return err
	}
	return c.enqueue(ctx, "ncclAllGather", func() string { return fmt.Sprintf("%d x %v", sendCount, dt) }, func(comm unsafe.Pointer) C.int {
		return C.cp_ncclAllGather(C.uint64_t(send), C.uint64_t(recv), C.size_t(sendCount), C.int(dt), comm, C.uintptr_t(s.Handle()))
	})
}

// ReduceScatter enqueues reducing Size()*recvCount elements and leaving block Rank() of the
// result in recv.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv cuda.DevicePtr, recvCount int, dt DataType, op RedOp, s *cuda.Stream) error {
	if err := checkArgs(recvCount, dt, op, true); err != nil {
		return err
	}
	return c.enqueue(ctx, "ncclReduceScatter", func() string { return fmt.Sprintf("%d x %v %v", recvCount, dt, op) }, func(comm unsafe.Pointer) C.int {
		return C.cp_ncclReduceScatter(C.uint64_t(send), C.uint64_t(recv), C.size_t(recvCount), C.int(dt), C.int(op), comm, C.uintptr_t(s.Handle()))
	})
}

// Group runs fn between ncclGroupStart and ncclGroupEnd so that the collectives fn enqueues
// on this communicator are fused. fn runs on the calling goroutine with its OS thread locked
// (NCCL's group state is per thread): it must not hand work to other goroutines.
func (c *Comm) Group(ctx context.Context, fn func() error) error {
	comm, err := c.handle()
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.dev.MakeCurrent(); err != nil {
		return err
	}
	if err := check(C.cp_ncclGroupStart(), "ncclGroupStart", "", comm); err != nil {
		return err
	}
	// NCCL's group state is per OS thread and Go reuses threads: a group left open (fn
	// panicking) would swallow every later NCCL call made on this thread.
	ended := false
	defer func() {
		if !ended {
			C.cp_ncclGroupEnd()
		}
	}()
	ferr := fn()
	rc := C.cp_ncclGroupEnd()
	ended = true
	if Result(rc) == InProgress {
		if err := c.waitReady(ctx, comm, "ncclGroupEnd", ""); err != nil {
			return err
		}
	} else if err := check(rc, "ncclGroupEnd", "", comm); err != nil {
		return errors.Join(ferr, err)
	}
	return ferr
}

// Wait blocks until everything enqueued on s has completed, polling the stream and the
// communicator's asynchronous error. At the deadline (ctx, else the communicator's timeout)
// or on an asynchronous error it aborts the communicator and returns an error (wrapping
// parallel.ErrTimeout for a deadline), so a collective whose peers never arrive cannot hang.
func (c *Comm) Wait(ctx context.Context, s *cuda.Stream) error {
	comm, err := c.handle()
	if err != nil {
		return err
	}
	// ncclCommGetAsyncError below needs the device's context current on this thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.dev.MakeCurrent(); err != nil {
		return c.fail(err)
	}
	deadline := parallel.Deadline(ctx, c.timeout)
	for pause := time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
		done, err := s.Query()
		if err != nil {
			return c.fail(err)
		}
		if done {
			return nil
		}
		// Details are formatted on the failure paths only: this loop runs for every collective.
		var st C.int
		if rc := C.cp_ncclCommGetAsyncError(comm, &st); rc != 0 {
			return c.fail(check(rc, "ncclCommGetAsyncError", c.who(), comm))
		}
		if r := Result(st); r != Success && r != InProgress {
			return c.fail(check(st, "asynchronous error", c.who(), comm))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return c.fail(timeoutError(ctx, "wait for stream", c.who(), c.timeout))
		}
		time.Sleep(pause)
	}
}

// Abort aborts the communicator (any goroutine may call it, e.g. to unblock a Wait); later
// calls fail with ErrAborted.
func (c *Comm) Abort() error {
	if c == nil {
		return nil
	}
	c.fail(errors.New("aborted by caller"))
	return nil
}

// Close finalises and destroys the communicator and drops its library reference. A
// non-blocking communicator is first polled until its last operation completed; when that,
// or finalisation, fails or does not finish within the timeout, the communicator is aborted
// instead. Nil-safe and idempotent.
func (c *Comm) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	comm := c.comm
	c.comm = nil
	if c.failed == nil {
		c.failed = ErrClosed
	}
	c.mu.Unlock()
	if comm == nil {
		return c.lib.Close()
	}
	detail := c.who()
	if c.nonBlocking {
		// Never hand NCCL a busy communicator here: ncclCommFinalize rejects it, and 2.28's
		// ncclCommDestroy returns from inside its internal group (NCCLCHECK(ncclCommEnsureReady)
		// after ncclGroupStartInternal), leaving the calling thread in a group for good.
		err := pollAsync(context.Background(), c.dev, comm, c.timeout, "wait before ncclCommFinalize", detail)
		if err == nil {
			var rc C.int
			rc, err = onFreshThread(c.dev, func() C.int { return C.cp_ncclCommFinalize(comm) })
			if err == nil && (Result(rc) == InProgress || Result(rc) == Success) {
				err = pollAsync(context.Background(), c.dev, comm, c.timeout, "ncclCommFinalize", detail)
			} else if err == nil {
				err = check(rc, "ncclCommFinalize", detail, comm)
			}
		}
		if err != nil {
			abortComm(c.dev, comm)
			return errors.Join(err, c.lib.Close())
		}
	}
	rc, err := onFreshThread(c.dev, func() C.int { return C.cp_ncclCommDestroy(comm) })
	if err == nil && Result(rc) != InProgress { // nothing is left to wait for after finalize
		err = check(rc, "ncclCommDestroy", detail, nil)
	}
	return errors.Join(err, c.lib.Close())
}
