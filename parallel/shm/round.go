package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/parallel"
)

// Operation kinds recorded in slot descriptors.
const (
	kindAllReduce = 1 + iota
	kindBroadcast
	kindAllGather
	kindBarrier
)

// desc is what must match across members for one operation: the kind, the reduce op or the
// root, and the AllReduce length (0 for the other kinds, whose lengths may differ).
type desc struct{ kind, arg, n uint32 }

func (d desc) String() string {
	switch d.kind {
	case kindAllReduce:
		return fmt.Sprintf("allreduce %s len %d", parallel.ReduceOp(d.arg), d.n)
	case kindBroadcast:
		return fmt.Sprintf("broadcast root %d", d.arg)
	case kindAllGather:
		return "allgather"
	case kindBarrier:
		return "barrier"
	}
	return fmt.Sprintf("unknown operation %d", d.kind)
}

// Reasons published in the abort word: code<<56 | reporter<<32 | culprit+1.
const (
	abortTimeout = 1 // the reporter's deadline passed while culprit had not arrived
	abortExited  = 2 // the culprit's process exited
	abortClosed  = 3 // the culprit closed the group
	abortFailed  = 4 // the reporter's operation failed otherwise (canceled, fallback error)
)

// testHookMissing, when set (tests), runs between checkLocked's look at the arrivals and its
// look at the members that are gone: where a member can arrive, complete and close.
var testHookMissing func()

// opErr wraps err as the failure of operation op at position seq.
func (g *Group) opErr(op string, seq uint64, err error) error {
	return &parallel.OpError{Group: g.name, Rank: g.rank, Op: op, Seq: seq, Err: err}
}

// roundLocked runs one shared-memory round for operation op: it writes this member's descriptor,
// payload length and data (fill writes into the slot's data area), publishes the arrival,
// waits for every member, and checks that every member called the same operation. It
// returns the buffer parity of the round, whose slots stay intact until this member starts
// its next round, and the deadline used. Called with g.mu held.
func (g *Group) roundLocked(ctx context.Context, op string, d desc, length uint64, fill func(data []byte)) (p int, seq uint64, deadline time.Time, err error) {
	seq = g.seq
	if g.closing.Load() || g.mem == nil {
		return 0, seq, deadline, g.opErr(op, seq, parallel.ErrClosed)
	}
	if g.broken != nil {
		return 0, seq, deadline, g.opErr(op, seq, g.broken)
	}
	if a := atomic.LoadUint64(g.abort); a != 0 {
		// Another member failed: this round could only complete with stale peers.
		g.broken = g.abortErr(a)
		return 0, seq, deadline, g.opErr(op, seq, g.broken)
	}
	deadline = parallel.Deadline(ctx, g.opts.Timeout)
	g.seq++
	p = int(seq & 1)
	off := g.l.slot(p, g.rank)
	hdr := g.mem[off : off+slotHdrBytes]
	binary.LittleEndian.PutUint32(hdr[slotKind:], d.kind)
	binary.LittleEndian.PutUint32(hdr[slotArg:], d.arg)
	binary.LittleEndian.PutUint32(hdr[slotN:], d.n)
	binary.LittleEndian.PutUint64(hdr[slotLen:], length)
	if fill != nil {
		fill(g.slotDataLocked(p, g.rank))
	}
	// Publish: the slot writes above happen before these sequentially consistent stores.
	atomic.StoreUint64(g.arrive[g.rank], seq+1)
	if atomic.AddUint64(g.arrivals, 1) == (seq+1)*uint64(len(g.ranks)) {
		g.ring()
	}
	err = g.waitLocked(ctx, seq, deadline)
	if a := atomic.LoadUint64(g.abort); err == nil && a != 0 {
		err = g.abortErr(a) // the round completed, but a member gave up on it
	}
	if err != nil {
		g.broken = err
		return 0, seq, deadline, g.opErr(op, seq, err)
	}
	d0 := g.slotDescLocked(p, 0)
	for r := range g.ranks {
		if dr := g.slotDescLocked(p, r); dr != d0 {
			err := fmt.Errorf("%w: member 0 called %s, member %d called %s", parallel.ErrMismatch, d0, r, dr)
			g.broken = err
			return 0, seq, deadline, g.opErr(op, seq, err)
		}
	}
	return p, seq, deadline, nil
}

// slotDataLocked is the data area of member r's slot in buffer p (mem is read under g.mu).
func (g *Group) slotDataLocked(p, r int) []byte {
	off := g.l.slot(p, r) + slotHdrBytes
	return g.mem[off : off+g.l.slotBytes]
}

// slotDescLocked is the descriptor member r wrote into its slot of buffer p.
func (g *Group) slotDescLocked(p, r int) desc {
	hdr := g.mem[g.l.slot(p, r):]
	d := desc{
		kind: binary.LittleEndian.Uint32(hdr[slotKind:]),
		arg:  binary.LittleEndian.Uint32(hdr[slotArg:]),
		n:    binary.LittleEndian.Uint32(hdr[slotN:]),
	}
	return d
}

// slotLenLocked is the payload length member r wrote into its slot of buffer p.
func (g *Group) slotLenLocked(p, r int) uint64 {
	return binary.LittleEndian.Uint64(g.mem[g.l.slot(p, r)+slotLen:])
}

// ring wakes every member sleeping on the bell. The bell changes before the waiter count is
// read, so a waiter that registered too late to be woken sees the new bell value (its
// futex wait returns at once) or the state that made us ring.
func (g *Group) ring() {
	atomic.AddUint32(g.bell, 1)
	if atomic.LoadUint32(g.waiters) > 0 {
		futexWakeAll(g.bell)
	}
}

// waitLocked waits until every member has arrived at round seq, or fails: it spins on the
// arrival counter, then yields the CPU a few times (so that members not yet arrived can run
// when there are more members than CPUs), then sleeps on the bell with a timeout of
// PollInterval, checking for failures at every wake-up.
func (g *Group) waitLocked(ctx context.Context, seq uint64, deadline time.Time) error {
	target := (seq + 1) * uint64(len(g.ranks))
	for range g.opts.Spin {
		if atomic.LoadUint64(g.arrivals) >= target {
			return nil
		}
	}
	for range g.opts.Yields {
		if atomic.LoadUint64(g.arrivals) >= target {
			return nil
		}
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
	slept := false
	for {
		atomic.AddUint32(g.waiters, 1)
		bell := atomic.LoadUint32(g.bell)
		if atomic.LoadUint64(g.arrivals) >= target {
			atomic.AddUint32(g.waiters, ^uint32(0))
			return nil
		}
		if err := g.checkLocked(ctx, seq, deadline, slept); err != nil {
			atomic.AddUint32(g.waiters, ^uint32(0))
			return err
		}
		futexWait(g.bell, bell, min(g.opts.PollInterval, time.Until(deadline)))
		atomic.AddUint32(g.waiters, ^uint32(0))
		slept = true
	}
}

// checkLocked returns why round seq cannot complete, or nil to keep waiting: the group was
// aborted by another member, this member is closing, a missing member closed the group or
// exited (process checks only once we have slept: they cost system calls), the context
// ended, or the deadline passed.
func (g *Group) checkLocked(ctx context.Context, seq uint64, deadline time.Time, checkProcs bool) error {
	if a := atomic.LoadUint64(g.abort); a != 0 {
		return g.abortErr(a)
	}
	if g.closing.Load() {
		return parallel.ErrClosed
	}
	var missing []int
	for r := range g.ranks {
		if atomic.LoadUint64(g.arrive[r]) < seq+1 {
			missing = append(missing, r)
		}
	}
	if testHookMissing != nil {
		testHookMissing()
	}
	// A member counts as lost only if it is gone and had not arrived: its flag (or its exit)
	// is read first and its arrival after, because a member that arrived may complete the
	// round with the others and close (or exit) between our look at the arrivals above and
	// this one; its arrival, made before it closed, is then visible.
	for _, r := range missing {
		if atomic.LoadUint32(g.closedFlag[r]) != 0 {
			if arrived := atomic.LoadUint64(g.arrive[r]); arrived < seq+1 {
				g.publishLocked(abortClosed, r)
				return g.notArrived(seq, missing, fmt.Errorf("%w: member %d (global rank %d) closed the group after %d of its rounds, while this member waits in round %d",
					parallel.ErrPeerLost, r, g.ranks[r], arrived, seq))
			}
		}
	}
	if checkProcs {
		for _, r := range missing {
			if g.peers[r].exited() && atomic.LoadUint64(g.arrive[r]) < seq+1 {
				g.publishLocked(abortExited, r)
				return g.notArrived(seq, missing, fmt.Errorf("%w: member %d (global rank %d, pid %d) exited", parallel.ErrPeerLost, r, g.ranks[r], g.peers[r].pid))
			}
		}
	}
	expired := !time.Now().Before(deadline)
	if ctx.Err() == nil && !expired {
		return nil
	}
	if atomic.LoadUint64(g.arrivals) >= (seq+1)*uint64(len(g.ranks)) {
		return nil // completed meanwhile: the caller's next look sees it
	}
	culprit := -1
	if len(missing) > 0 {
		culprit = missing[0]
	}
	if err := ctx.Err(); err != nil {
		code := abortFailed
		if err == context.DeadlineExceeded {
			code = abortTimeout
		}
		g.publishLocked(code, culprit)
		return g.notArrived(seq, missing, fmt.Errorf("%w: %w (members %v had not arrived)", parallel.ErrTimeout, err, missing))
	}
	// The context has not ended, so the deadline expired.
	g.publishLocked(abortTimeout, culprit)
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return g.notArrived(seq, missing, fmt.Errorf("%w: %w (members %v had not arrived)", parallel.ErrTimeout, context.DeadlineExceeded, missing))
	}
	return g.notArrived(seq, missing, fmt.Errorf("%w after %v: members %v had not arrived", parallel.ErrTimeout, g.opts.Timeout, missing))
}

// notArrived wraps err, the failure of round seq, with how many rounds each missing member
// had entered (read from the members' arrival words, which outlive a member that exited).
func (g *Group) notArrived(seq uint64, missing []int, err error) error {
	entered := make([]uint64, len(missing))
	for i, r := range missing {
		entered[i] = min(atomic.LoadUint64(g.arrive[r]), seq)
	}
	return &parallel.NotArrivedError{Seq: seq, Missing: missing, Entered: entered, Err: err}
}

// publishLocked records why the group failed, if no reason was recorded yet, and wakes everyone.
func (g *Group) publishLocked(code, culprit int) {
	v := uint64(code)<<56 | uint64(g.rank)<<32 | uint64(uint32(culprit+1))
	atomic.CompareAndSwapUint64(g.abort, 0, v)
	g.ring()
}

// abortErr turns a published reason into this member's error.
func (g *Group) abortErr(a uint64) error {
	code, reporter, culprit := int(a>>56), int(a>>32)&0xffffff, int(uint32(a))-1
	who := func(r int) string {
		if r < 0 || r >= len(g.ranks) {
			return "a member"
		}
		return fmt.Sprintf("member %d (global rank %d)", r, g.ranks[r])
	}
	switch code {
	case abortTimeout:
		return fmt.Errorf("%w: %s timed out waiting for %s", parallel.ErrTimeout, who(reporter), who(culprit))
	case abortExited:
		return fmt.Errorf("%w: %s exited (reported by %s)", parallel.ErrPeerLost, who(culprit), who(reporter))
	case abortClosed:
		return fmt.Errorf("%w: %s closed the group (reported by %s)", parallel.ErrPeerLost, who(culprit), who(reporter))
	default:
		return fmt.Errorf("%w: %s abandoned the group after an error", parallel.ErrPeerLost, who(reporter))
	}
}
