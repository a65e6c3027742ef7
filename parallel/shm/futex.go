package shm

import (
	"math"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the word lives in a MAP_SHARED mapping and
// waiters and wakers are in different processes (or hold different mappings of it).
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *addr == val, for at most d (or until woken, or spuriously).
func futexWait(addr *uint32, val uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	// EAGAIN (the word changed), ETIMEDOUT and EINTR all mean: look again.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWakeAll wakes every waiter on addr.
func futexWakeAll(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}
