package shm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/parallel"
)

// ErrNotLocal is wrapped by the error New returns when the members of the bootstrap group
// are not all on one host (or cannot see one shared-memory directory).
var ErrNotLocal = errors.New("shm: group members are not all on one host")

// ErrUnknownBackend is wrapped by the error of a consensus backend that is not auto, shm or
// gloo (Options.Backend or EnvBackend).
var ErrUnknownBackend = errors.New("shm: unknown consensus backend")

// unknownBackendHello starts the error a member with an unknown backend tells the others.
const unknownBackendHello = "unknown consensus backend"

// Defaults for Options.
const (
	DefaultSlotBytes    = 4096
	DefaultDir          = "/dev/shm"
	DefaultPollInterval = 10 * time.Millisecond
	maxSlotBytes        = 1 << 20
)

// Options tune a shared-memory group. Every member must use the same SlotBytes; the rest
// may differ.
type Options struct {
	// Timeout bounds every collective whose context has no earlier deadline
	// (default parallel.DefaultTimeout).
	Timeout time.Duration
	// SlotBytes is each member's payload capacity per operation in shared memory: AllReduce
	// vectors up to SlotBytes/8 elements and Broadcast/AllGather payloads up to SlotBytes
	// bytes go through the segment, longer ones through the bootstrap group. A multiple of 8
	// between 64 and 1 MiB; default DefaultSlotBytes.
	SlotBytes int
	// Dir is the shared-memory directory (default DefaultDir) whose device and inode are part
	// of a member's host identity: members that see different ones are not on one host. The
	// segment itself is anonymous memory and lives in no directory.
	Dir string
	// PollInterval is how often a sleeping waiter checks its deadline and its peers' health
	// (default DefaultPollInterval).
	PollInterval time.Duration
	// Spin is how many times a waiter checks for completion in a busy loop before it
	// yields; 0 chooses (a few hundred when the group has no more members than CPUs, else a
	// few dozen), a negative value never spins.
	Spin int
	// Yields is how many times a waiter then yields the CPU (sched_yield), checking for
	// completion after each, before it sleeps on the futex; 0 chooses (8), a negative value
	// never yields. Spinning and yielding are bounded: a waiter never holds a CPU for long.
	Yields int
	// Backend overrides CPCACHE_CONSENSUS_BACKEND for Consensus ("auto", "shm", "gloo").
	Backend string
}

func (o Options) withDefaults(size int) Options {
	if o.Timeout <= 0 {
		o.Timeout = parallel.DefaultTimeout
	}
	if o.SlotBytes == 0 {
		o.SlotBytes = DefaultSlotBytes
	}
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.Spin == 0 {
		o.Spin = 64
		if size <= runtime.NumCPU() {
			o.Spin = 256
		}
	}
	if o.Yields == 0 {
		o.Yields = 8
	}
	return o
}

func (o Options) validate() error {
	if o.SlotBytes < 64 || o.SlotBytes > maxSlotBytes || o.SlotBytes%8 != 0 {
		return fmt.Errorf("shm: SlotBytes %d must be a multiple of 8 between 64 and %d", o.SlotBytes, maxSlotBytes)
	}
	return nil
}

// Group is one member's handle on a shared-memory group. It implements parallel.Group.
type Group struct {
	name  string
	rank  int
	ranks []int
	boot  parallel.Group
	opts  Options
	l     layout

	// Pointers into mem for the shared words, set at creation; dereferenced only while
	// mem is mapped (under mu, or by Close before it unmaps).
	bell, waiters   *uint32
	arrivals, abort *uint64
	arrive          []*uint64 // arrive[r]: rounds member r has arrived at
	closedFlag      []*uint32 // closedFlag[r]: member r closed the group

	closing atomic.Bool // Close was called on this member

	mu        sync.Mutex // serialises collectives and Close's unmapping; protects everything below
	mem       []byte     // the mapping; nil after Close
	peers     []peerProc // watches on the members' processes; closed by Close
	seq       uint64     // rounds this member has started
	broken    error      // sticky error after a failed collective
	fallbacks uint64     // operations that went through the bootstrap group
}

var _ parallel.Group = (*Group)(nil)

func (g *Group) Rank() int    { return g.rank }
func (g *Group) Size() int    { return len(g.ranks) }
func (g *Group) Ranks() []int { return append([]int(nil), g.ranks...) }
func (g *Group) Name() string { return g.name }

// Fallbacks is the number of operations this member ran through the bootstrap group
// because a payload did not fit in its slot.
func (g *Group) Fallbacks() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fallbacks
}

// New creates a shared-memory group over the members of boot. It is collective: every
// member of boot calls it, with the same SlotBytes. It fails on every member with an error
// wrapping ErrNotLocal when the members are not all on one host.
func New(ctx context.Context, boot parallel.Group, opts Options) (*Group, error) {
	g, fallback, err := create(ctx, boot, opts, modeShm)
	if err == nil && fallback != nil {
		err = fallback
	}
	return g, err
}

// create runs the creation protocol. With mode auto, members that are not local yield
// (nil, reason, nil) so that the caller uses the bootstrap group; with mode gloo, every
// member returns (nil, reason, nil) after agreeing on it.
func create(ctx context.Context, boot parallel.Group, opts Options, mode string) (g *Group, fallback, err error) {
	if boot == nil {
		return nil, nil, errors.New("shm: nil bootstrap group")
	}
	opts = opts.withDefaults(boot.Size())
	me := localHello(mode, opts.Dir)
	if verr := opts.validate(); verr != nil {
		me.err = strings.TrimPrefix(verr.Error(), "shm: ")
	}
	parts, err := boot.AllGather(ctx, me.encode())
	if err != nil {
		return nil, nil, fmt.Errorf("shm: exchange host identity over %s: %w", boot.Name(), err)
	}
	hs := make([]hello, len(parts))
	for r, p := range parts {
		if hs[r], err = decodeHello(p); err != nil {
			return nil, nil, fmt.Errorf("shm: member %d of %s: %w", r, boot.Name(), err)
		}
	}
	for r, h := range hs {
		if h.err != "" {
			err := fmt.Errorf("shm: member %d of %s: %s", r, boot.Name(), h.err)
			if strings.HasPrefix(h.err, unknownBackendHello) {
				err = fmt.Errorf("%w: %w", ErrUnknownBackend, err) // the same kind on every member
			}
			return nil, nil, err
		}
	}
	for r, h := range hs {
		if h.mode != hs[0].mode {
			return nil, nil, fmt.Errorf("shm: members disagree on the consensus backend: member 0 asked for %q, member %d for %q", hs[0].mode, r, h.mode)
		}
	}
	if mode == modeGloo {
		return nil, fmt.Errorf("shm: consensus backend forced to %q", modeGloo), nil
	}
	if err := sameHost(hs); err != nil {
		err = fmt.Errorf("shm: group %s: %w", boot.Name(), err)
		if mode == modeAuto {
			return nil, err, nil
		}
		return nil, nil, err
	}
	l := newLayout(boot.Size(), opts.SlotBytes)
	mem, err := attach(ctx, boot, l)
	if err != nil {
		return nil, nil, err
	}
	return newGroup(boot, opts, l, mem, hs), nil, nil
}

// attach creates (rank 0) or opens (others) the segment, agrees that every member mapped it
// and stops offering it.
func attach(ctx context.Context, boot parallel.Group, l layout) ([]byte, error) {
	var (
		mem []byte
		msg []byte
	)
	if boot.Rank() == 0 {
		seg, err := createSegment(l)
		if err != nil {
			msg = []byte("error " + err.Error())
		} else {
			mem = seg.Mem
			msg = []byte("handle " + seg.Handle)
			defer seg.Unshare() // after the agreement below, whatever its outcome
		}
	}
	got, err := boot.Broadcast(ctx, 0, msg)
	if err != nil {
		if mem != nil {
			unix.Munmap(mem)
		}
		return nil, fmt.Errorf("shm: broadcast segment handle over %s: %w", boot.Name(), err)
	}
	if e, ok := strings.CutPrefix(string(got), "error "); ok {
		return nil, fmt.Errorf("shm: member 0 could not create the segment: %s", e)
	}
	handle, ok := strings.CutPrefix(string(got), "handle ")
	if !ok {
		return nil, fmt.Errorf("shm: member 0 sent %q, not a segment handle", got)
	}
	status := ""
	if boot.Rank() != 0 {
		var err error
		if mem, err = openSegment(ctx, handle, l); err != nil {
			status = err.Error()
		}
	}
	statuses, err := boot.AllGather(ctx, []byte(status))
	if err == nil {
		for r, s := range statuses {
			if len(s) > 0 {
				err = fmt.Errorf("shm: member %d could not map the segment: %s", r, strings.TrimPrefix(string(s), "shm: "))
				break
			}
		}
	} else {
		err = fmt.Errorf("shm: agree on the segment over %s: %w", boot.Name(), err)
	}
	if err != nil {
		if mem != nil {
			unix.Munmap(mem)
		}
		return nil, err
	}
	return mem, nil
}

func newGroup(boot parallel.Group, opts Options, l layout, mem []byte, hs []hello) *Group {
	n := boot.Size()
	g := &Group{
		name:       boot.Name(),
		rank:       boot.Rank(),
		ranks:      boot.Ranks(),
		boot:       boot,
		opts:       opts,
		l:          l,
		mem:        mem,
		bell:       u32(mem, offBell),
		waiters:    u32(mem, offWaiters),
		arrivals:   u64(mem, offArrivals),
		abort:      u64(mem, offAbort),
		arrive:     make([]*uint64, n),
		closedFlag: make([]*uint32, n),
		peers:      make([]peerProc, n),
	}
	for r := range n {
		g.arrive[r] = u64(mem, g.l.ctl(r)+ctlArrive)
		g.closedFlag[r] = u32(mem, g.l.ctl(r)+ctlClosed)
		g.peers[r] = watchPeer(hs[r].pid)
	}
	atomic.StoreUint32(u32(mem, g.l.ctl(g.rank)+ctlPid), uint32(hs[g.rank].pid))
	return g
}

// Close marks this member gone (peers waiting for it, now or later, fail with
// parallel.ErrPeerLost), fails a collective of this member that is waiting with parallel.ErrClosed,
// and unmaps the segment. It does not close the bootstrap group. Nil-safe and idempotent.
func (g *Group) Close() error {
	if g == nil || !g.closing.CompareAndSwap(false, true) {
		return nil
	}
	// mem stays mapped until we hold mu, and only Close unmaps it.
	atomic.StoreUint32(g.closedFlag[g.rank], 1)
	g.ring()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.peers {
		g.peers[i].close()
	}
	err := unix.Munmap(g.mem)
	g.mem = nil
	if err != nil {
		return fmt.Errorf("shm: unmap segment of %s: %w", g.name, err)
	}
	return nil
}
