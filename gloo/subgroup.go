package gloo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// NewGroup creates a group over a subset of the world's ranks (global ranks, in the order
// that defines group ranks). Like torch.distributed.new_group it is collective over the
// world: every world rank calls it, in the same order relative to other NewGroup calls, with
// the same ranks. It returns nil (and no error) on ranks that are not members. Members
// connect through the store under a prefix unique to this call.
func NewGroup(world *Group, ranks []int) (*Group, error) {
	return newGroup(world, "group", ranks)
}

func newGroup(world *Group, kind string, ranks []int) (*Group, error) {
	if err := checkRanks(world, ranks); err != nil {
		return nil, err
	}
	k, err := world.agree("new_group", fmt.Sprintf("%s %v", kind, ranks))
	if err != nil {
		return nil, err
	}
	me := slices.Index(ranks, world.rank)
	if me < 0 {
		return nil, nil
	}
	return connect(world, fmt.Sprintf("g%d", k), kind, ranks, me)
}

func checkRanks(world *Group, ranks []int) error {
	if world == nil || world.shared == nil {
		return fmt.Errorf("gloo: %w: new groups are created from a world group", parallel.ErrBadArgument)
	}
	if len(ranks) == 0 {
		return fmt.Errorf("gloo: %w: empty rank list", parallel.ErrBadArgument)
	}
	seen := map[int]bool{}
	for _, r := range ranks {
		if r < 0 || r >= world.Size() {
			return fmt.Errorf("gloo: %w: rank %d out of range for world size %d", parallel.ErrBadArgument, r, world.Size())
		}
		if seen[r] {
			return fmt.Errorf("gloo: %w: rank %d listed twice in %v", parallel.ErrBadArgument, r, ranks)
		}
		seen[r] = true
	}
	return nil
}

// agree runs one world AllGather that checks every rank passed the same description and
// returns the sequence number of this group-creating call.
func (world *Group) agree(op, desc string) (int, error) {
	world.mu.Lock()
	defer world.mu.Unlock()
	k := world.groupSeq
	world.groupSeq++
	var parts [][]byte
	mine := fmt.Sprintf("%d %s", k, desc)
	err := world.runLocked(context.Background(), op, func(c *cCtx, timeout time.Duration) error {
		var err error
		parts, err = c.allGather([]byte(mine), world.Size(), timeout)
		return err
	})
	if err != nil {
		return 0, err
	}
	for r, p := range parts {
		if string(p) != mine {
			return 0, &parallel.OpError{Group: world.name, Rank: world.rank, Op: op, Err: fmt.Errorf(
				"gloo: %w: rank %d asked for %q, rank %d for %q", parallel.ErrMismatch, world.rank, mine, r, p)}
		}
	}
	return k, nil
}

// connect creates this member's context for a group whose keys live under sub.
func connect(world *Group, sub, kind string, ranks []int, me int) (*Group, error) {
	name := parallel.GroupName(kind, ranks)
	c, err := world.shared.store.newCtx(world.shared.prefix+"/"+sub, me, len(ranks), world.shared.dev, world.timeout)
	if err != nil {
		if errors.Is(err, errStoreClosed) {
			return nil, fmt.Errorf("gloo: connect %s: %w (the world group was closed)", name, parallel.ErrClosed)
		}
		return nil, fmt.Errorf("gloo: connect %s (rank %d of %d): %w", name, me, len(ranks), classify(err, false))
	}
	return &Group{name: name, rank: me, ranks: append([]int(nil), ranks...), timeout: world.timeout, ctx: c}, nil
}

// LayoutGroups holds this rank's group of every kind of a parallel.Layout.
type LayoutGroups struct {
	Layout *parallel.Layout
	groups map[parallel.GroupKind]*Group
}

// NewLayoutGroups creates this rank's group of every kind in parallel.AllKinds (TP, attention
// TP and CP, EP, replica, slab) in one call. It is collective over the world: every rank
// calls it with the same layout (checked), and each then connects only to its own groups.
// Groups of different kinds are separate Gloo contexts even when their ranks coincide, so
// that their collectives never interleave.
func NewLayoutGroups(world *Group, l *parallel.Layout) (*LayoutGroups, error) {
	if world == nil || world.shared == nil {
		return nil, fmt.Errorf("gloo: %w: layout groups are created from a world group", parallel.ErrBadArgument)
	}
	if l == nil {
		return nil, fmt.Errorf("gloo: %w: nil layout", parallel.ErrBadArgument)
	}
	if l.Config.World != world.Size() {
		return nil, fmt.Errorf("gloo: %w: layout %v is for %d ranks, the world has %d", parallel.ErrBadArgument, l, l.Config.World, world.Size())
	}
	k, err := world.agree("new_layout_groups", l.String())
	if err != nil {
		return nil, err
	}
	lg := &LayoutGroups{Layout: l, groups: map[parallel.GroupKind]*Group{}}
	for _, kind := range parallel.AllKinds {
		ranks := l.GroupOf(kind, world.rank)
		index := slices.IndexFunc(l.Groups(kind), func(g []int) bool { return g[0] == ranks[0] })
		g, err := connect(world, fmt.Sprintf("L%d/%s/%d", k, kind, index), kind.String(), ranks, slices.Index(ranks, world.rank))
		if err != nil {
			lg.Close()
			return nil, err
		}
		lg.groups[kind] = g
	}
	return lg, nil
}

// Group returns this rank's group of kind (nil for an unknown kind).
func (lg *LayoutGroups) Group(kind parallel.GroupKind) *Group {
	if lg == nil {
		return nil
	}
	return lg.groups[kind]
}

// Close closes every group. It is nil-safe and idempotent.
func (lg *LayoutGroups) Close() error {
	if lg == nil {
		return nil
	}
	for _, g := range lg.groups {
		g.Close()
	}
	return nil
}
