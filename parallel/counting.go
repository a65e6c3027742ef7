package parallel

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
)

// Counted wraps a Group and records every collective this member makes: counts per kind and
// a running hash of the sequence (kind and arguments, not data). Members that made the same
// calls in the same order have equal Counts.
type Counted struct {
	Group

	mu     sync.Mutex // protects counts
	counts Counts
}

// Counts summarises the collectives one member made.
type Counts struct {
	AllReduce, Broadcast, AllGather, Barrier int
	// SeqHash is an FNV-1a hash over the sequence of calls with their ops, lengths and roots.
	SeqHash uint64
}

// Total is the number of collectives.
func (c Counts) Total() int { return c.AllReduce + c.Broadcast + c.AllGather + c.Barrier }

// Count wraps g.
func Count(g Group) *Counted { return &Counted{Group: g, counts: Counts{SeqHash: fnvOffset}} }

const fnvOffset = 14695981039346656037

// Counts returns a snapshot.
func (c *Counted) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts
}

func (c *Counted) record(kind *int, call string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*kind++
	h := fnv.New64a()
	fmt.Fprintf(h, "%x|%s", c.counts.SeqHash, call)
	c.counts.SeqHash = h.Sum64()
}

func (c *Counted) AllReduce(ctx context.Context, op ReduceOp, vals []int64) error {
	c.record(&c.counts.AllReduce, fmt.Sprintf("allreduce %s %d", op, len(vals)))
	return c.Group.AllReduce(ctx, op, vals)
}

func (c *Counted) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	c.record(&c.counts.Broadcast, fmt.Sprintf("broadcast %d", root))
	return c.Group.Broadcast(ctx, root, data)
}

func (c *Counted) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	c.record(&c.counts.AllGather, "allgather")
	return c.Group.AllGather(ctx, data)
}

func (c *Counted) Barrier(ctx context.Context) error {
	c.record(&c.counts.Barrier, "barrier")
	return c.Group.Barrier(ctx)
}

// Close closes the wrapped group (Count's wrapper shares it). It is nil-safe, also for a
// wrapper of a nil group; idempotence is the wrapped group's.
func (c *Counted) Close() error {
	if c == nil || c.Group == nil {
		return nil
	}
	return c.Group.Close()
}
