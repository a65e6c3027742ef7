package local

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// Options tune an in-process group.
type Options struct {
	// Timeout bounds every collective whose context has no earlier deadline
	// (default parallel.DefaultTimeout).
	Timeout time.Duration
	// Kind names the group ("world", "attn_cp", ...); the name is parallel.GroupName(Kind, ranks).
	Kind string
}

// New creates an in-process group over the given global ranks and returns one member per
// rank, in group-rank order. Each member is used by one goroutine at a time.
func New(ranks []int, opts Options) []*Member {
	if opts.Timeout <= 0 {
		opts.Timeout = parallel.DefaultTimeout
	}
	if opts.Kind == "" {
		opts.Kind = "local"
	}
	h := &hub{
		name:    parallel.GroupName(opts.Kind, ranks),
		ranks:   append([]int(nil), ranks...),
		timeout: opts.Timeout,
		rounds:  map[uint64]*round{},
	}
	members := make([]*Member, len(ranks))
	for i := range ranks {
		members[i] = &Member{hub: h, rank: i}
	}
	return members
}

// World creates an in-process group of n ranks 0..n-1.
func World(n int, opts Options) []*Member {
	ranks := make([]int, n)
	for i := range ranks {
		ranks[i] = i
	}
	if opts.Kind == "" {
		opts.Kind = "world"
	}
	return New(ranks, opts)
}

// Groups returns members as []parallel.Group.
func Groups(members []*Member) []parallel.Group {
	gs := make([]parallel.Group, len(members))
	for i, m := range members {
		gs[i] = m
	}
	return gs
}

// hub is the shared state of one in-process group.
type hub struct {
	name    string
	ranks   []int
	timeout time.Duration

	mu     sync.Mutex        // protects everything below
	rounds map[uint64]*round // operations some member has entered and not all have left
	closed []bool            // closed[r]: member r called Close (allocated lazily)
}

// round is one collective, identified by its position in the members' operation sequence.
type round struct {
	kind    string // "allreduce min 8", "broadcast root 2", ...
	first   int    // the member that opened the round, for mismatch messages
	arrived int
	left    int
	vec     []int64
	parts   [][]byte
	done    chan struct{}
	err     error // set before done is closed when the round failed for everyone
}

// Member is one rank's handle on an in-process group. It implements parallel.Group.
type Member struct {
	hub  *hub
	rank int

	// Touched only by the goroutine calling collectives (one at a time, like any Group).
	seq    uint64
	broken error // sticky error after a timeout, a lost peer or a mismatch
	closed bool
}

var _ parallel.Group = (*Member)(nil)

func (m *Member) Rank() int    { return m.rank }
func (m *Member) Size() int    { return len(m.hub.ranks) }
func (m *Member) Ranks() []int { return append([]int(nil), m.hub.ranks...) }
func (m *Member) Name() string { return m.hub.name }

// Close marks this member gone: peers waiting for it, now or later, fail with ErrPeerLost.
func (m *Member) Close() error {
	if m == nil || m.closed {
		return nil
	}
	m.closed = true
	h := m.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed == nil {
		h.closed = make([]bool, len(h.ranks))
	}
	h.closed[m.rank] = true
	for _, rd := range h.rounds {
		h.failLocked(rd, fmt.Errorf("%w: member %d (global rank %d) closed the group", parallel.ErrPeerLost, m.rank, h.ranks[m.rank]))
	}
	return nil
}

func (m *Member) AllReduce(ctx context.Context, op parallel.ReduceOp, vals []int64) error {
	if !op.Valid() {
		return m.opErr("allreduce", fmt.Errorf("%w: reduce op %d", parallel.ErrBadArgument, int(op)))
	}
	kind := fmt.Sprintf("allreduce %s len %d", op, len(vals))
	rd, err := m.enter(ctx, "allreduce", kind, func(rd *round) {
		if rd.vec == nil {
			rd.vec = append(make([]int64, 0, len(vals)), vals...)
		} else {
			op.Apply(rd.vec, vals)
		}
	})
	if err != nil {
		return err
	}
	copy(vals, rd.vec)
	m.leave(rd)
	return nil
}

func (m *Member) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if root < 0 || root >= m.Size() {
		return nil, m.opErr("broadcast", fmt.Errorf("%w: root %d not in group of size %d", parallel.ErrBadArgument, root, m.Size()))
	}
	rd, err := m.enter(ctx, "broadcast", fmt.Sprintf("broadcast root %d", root), func(rd *round) {
		if m.rank == root {
			rd.parts = [][]byte{append([]byte{}, data...)}
		}
	})
	if err != nil {
		return nil, err
	}
	out := append([]byte{}, rd.parts[0]...)
	m.leave(rd)
	return out, nil
}

func (m *Member) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	rd, err := m.enter(ctx, "allgather", "allgather", func(rd *round) {
		if rd.parts == nil {
			rd.parts = make([][]byte, m.Size())
		}
		rd.parts[m.rank] = append([]byte{}, data...)
	})
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(rd.parts))
	for i, p := range rd.parts {
		out[i] = append([]byte{}, p...)
	}
	m.leave(rd)
	return out, nil
}

func (m *Member) Barrier(ctx context.Context) error {
	rd, err := m.enter(ctx, "barrier", "barrier", func(*round) {})
	if err != nil {
		return err
	}
	m.leave(rd)
	return nil
}

func (m *Member) opErr(op string, err error) error {
	return &parallel.OpError{Group: m.hub.name, Rank: m.rank, Op: op, Seq: m.seq, Err: err}
}

// enter joins the round at this member's next sequence number, contributes, and waits until
// every member has contributed or the round fails.
func (m *Member) enter(ctx context.Context, op, kind string, contribute func(*round)) (*round, error) {
	if m.closed {
		return nil, m.opErr(op, parallel.ErrClosed)
	}
	if m.broken != nil {
		return nil, m.opErr(op, m.broken)
	}
	seq := m.seq
	m.seq++
	h := m.hub
	h.mu.Lock()
	rd := h.rounds[seq]
	if rd == nil {
		rd = &round{kind: kind, first: m.rank, done: make(chan struct{})}
		h.rounds[seq] = rd
		for r, c := range h.closed {
			if c && r != m.rank {
				h.failLocked(rd, fmt.Errorf("%w: member %d (global rank %d) closed the group", parallel.ErrPeerLost, r, h.ranks[r]))
				break
			}
		}
	}
	if rd.err == nil && rd.kind != kind {
		h.failLocked(rd, fmt.Errorf("%w: member %d called %q, member %d called %q", parallel.ErrMismatch, rd.first, rd.kind, m.rank, kind))
	}
	if rd.err == nil {
		contribute(rd)
		rd.arrived++
		if rd.arrived == len(h.ranks) {
			close(rd.done)
		}
	}
	h.mu.Unlock()

	deadline := parallel.Deadline(ctx, h.timeout)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-rd.done:
	case <-ctx.Done():
		m.fail(rd, fmt.Errorf("%w: %w", parallel.ErrTimeout, ctx.Err()))
	case <-timer.C:
		if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
			// The context's deadline is the one that passed (its Done may not be closed yet).
			m.fail(rd, fmt.Errorf("%w: %w", parallel.ErrTimeout, context.DeadlineExceeded))
		} else {
			m.fail(rd, fmt.Errorf("%w after %v", parallel.ErrTimeout, h.timeout))
		}
	}
	if rd.err != nil {
		m.broken = rd.err
		return nil, m.opErr(op, rd.err)
	}
	return rd, nil
}

// fail fails a round that timed out on this member: for this member alone if the round
// completed meanwhile, else for every member (they would all time out too).
func (m *Member) fail(rd *round, err error) {
	h := m.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-rd.done:
		if rd.err == nil {
			return // completed just in time
		}
	default:
		h.failLocked(rd, fmt.Errorf("%w (%d of %d members arrived)", err, rd.arrived, len(h.ranks)))
	}
}

// failLocked ends a round with err for every member still in it.
func (h *hub) failLocked(rd *round, err error) {
	select {
	case <-rd.done:
		return
	default:
	}
	rd.err = err
	close(rd.done)
}

// leave records that this member has read the round's result; the last one frees it.
func (m *Member) leave(rd *round) {
	h := m.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	rd.left++
	if rd.left == len(h.ranks) {
		delete(h.rounds, m.seq-1)
	}
}
