package parallel

import (
	"errors"
	"fmt"
	"slices"
)

// LayoutConfig is the parallel configuration of a job, in SGLang's terms.
type LayoutConfig struct {
	World       int  // number of ranks; must equal TP (no pipeline parallelism)
	TP          int  // tensor-parallel size (0: World)
	DP          int  // data-parallel size (0: 1)
	AttnCP      int  // attention context-parallel size (0: 1)
	EP          int  // expert-parallel size (0: 1)
	DPAttention bool // DP attention: the attention layers run DP replicas inside the TP world
}

// maxWorld bounds the world size: a layout holds every group as rank lists, so a size far
// beyond any job would exhaust memory instead of failing with an error naming it.
const maxWorld = 1 << 20

// ErrBadLayout is wrapped by every layout validation error.
var ErrBadLayout = errors.New("parallel: bad layout")

// GroupKind names a family of groups that partitions the world.
type GroupKind int

// Group kinds. KindReplica is the attention-DP block (every rank that runs the same
// scheduler); KindSlab is the attention-CP group (the ranks that share L2 slabs).
const (
	KindTP GroupKind = iota
	KindAttnTP
	KindAttnCP
	KindEP
	KindReplica
	KindSlab
)

// AllKinds lists every group kind in a fixed order.
var AllKinds = []GroupKind{KindTP, KindAttnTP, KindAttnCP, KindEP, KindReplica, KindSlab}

func (k GroupKind) String() string {
	switch k {
	case KindTP:
		return "tp"
	case KindAttnTP:
		return "attn_tp"
	case KindAttnCP:
		return "attn_cp"
	case KindEP:
		return "ep"
	case KindReplica:
		return "replica"
	case KindSlab:
		return "slab"
	}
	return fmt.Sprintf("GroupKind(%d)", int(k))
}

// Layout is a validated parallel layout: every group of every kind as global rank lists.
// Rank order is (dp, cp, tp) with tp fastest:
// rank = dp_i*(AttnCP*AttnTP) + cp_i*AttnTP + tp_i.
type Layout struct {
	Config LayoutConfig
	AttnDP int // DP if DPAttention, else 1
	AttnTP int // TP / AttnDP / AttnCP
	AttnCP int
	groups map[GroupKind][][]int
	index  map[GroupKind][]int // index[kind][rank] = position of rank's group in groups[kind]
}

// Coord is a rank's position in the attention layout.
type Coord struct{ DP, CP, TP int }

// NewLayout validates cfg and builds every group. Errors wrap ErrBadLayout and name the value.
func NewLayout(cfg LayoutConfig) (*Layout, error) {
	if cfg.TP == 0 {
		cfg.TP = cfg.World
	}
	for _, v := range []*int{&cfg.DP, &cfg.AttnCP, &cfg.EP} {
		if *v == 0 {
			*v = 1
		}
	}
	bad := func(format string, args ...any) (*Layout, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrBadLayout}, args...)...)
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"world", cfg.World}, {"tp", cfg.TP}, {"dp", cfg.DP}, {"attn-cp", cfg.AttnCP}, {"ep", cfg.EP}} {
		if d.v < 1 {
			return bad("%s size %d must be positive", d.name, d.v)
		}
	}
	if cfg.World > maxWorld {
		return bad("world size %d is more than the %d ranks a layout supports", cfg.World, maxWorld)
	}
	if cfg.TP != cfg.World {
		return bad("tp %d must equal world %d (pipeline parallelism is not supported)", cfg.TP, cfg.World)
	}
	attnDP := 1
	if cfg.DPAttention {
		attnDP = cfg.DP
	} else if cfg.DP > 1 {
		return bad("dp %d needs DP attention; without it each DP replica is a separate world", cfg.DP)
	}
	if cfg.TP%attnDP != 0 {
		return bad("tp %d is not divisible by dp %d", cfg.TP, attnDP)
	}
	perDP := cfg.TP / attnDP
	if cfg.AttnCP > perDP {
		return bad("attn-cp %d needs %d ranks per DP replica, but tp %d / dp %d gives %d", cfg.AttnCP, cfg.AttnCP, cfg.TP, attnDP, perDP)
	}
	if perDP%cfg.AttnCP != 0 {
		return bad("tp %d / dp %d = %d ranks per DP replica is not divisible by attn-cp %d", cfg.TP, attnDP, perDP, cfg.AttnCP)
	}
	if cfg.World%cfg.EP != 0 {
		return bad("ep %d does not divide world %d", cfg.EP, cfg.World)
	}
	l := &Layout{Config: cfg, AttnDP: attnDP, AttnCP: cfg.AttnCP, AttnTP: perDP / cfg.AttnCP}
	l.build()
	return l, nil
}

func (l *Layout) build() {
	w := l.Config.World
	l.groups = map[GroupKind][][]int{
		KindTP:      {seq(0, w, 1)},
		KindAttnTP:  blocks(w, l.AttnTP),
		KindEP:      blocks(w, l.Config.EP),
		KindReplica: blocks(w, l.AttnCP*l.AttnTP),
	}
	var cp [][]int
	for d := 0; d < l.AttnDP; d++ {
		for t := 0; t < l.AttnTP; t++ {
			cp = append(cp, seq(d*l.AttnCP*l.AttnTP+t, l.AttnCP, l.AttnTP))
		}
	}
	slices.SortFunc(cp, slices.Compare)
	l.groups[KindAttnCP] = cp
	l.groups[KindSlab] = cp
	l.index = map[GroupKind][]int{}
	for kind, gs := range l.groups {
		idx := make([]int, w)
		for gi, g := range gs {
			for _, r := range g {
				idx[r] = gi
			}
		}
		l.index[kind] = idx
	}
}

// seq returns n ranks start, start+stride, ...
func seq(start, n, stride int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = start + i*stride
	}
	return s
}

func blocks(world, size int) [][]int {
	out := make([][]int, 0, world/size)
	for b := 0; b < world; b += size {
		out = append(out, seq(b, size, 1))
	}
	return out
}

// Groups returns every group of kind, sorted by first rank; each a sorted list of global
// ranks. The caller must not modify the result.
func (l *Layout) Groups(kind GroupKind) [][]int { return l.groups[kind] }

// GroupOf returns the group of kind that contains rank (nil if rank is out of range).
func (l *Layout) GroupOf(kind GroupKind, rank int) []int {
	if rank < 0 || rank >= l.Config.World {
		return nil
	}
	return l.groups[kind][l.index[kind][rank]]
}

// ReplicaGroup is rank's attention-DP block: the ranks that hold replicas of the cache
// metadata and run its consensus.
func (l *Layout) ReplicaGroup(rank int) []int { return l.GroupOf(KindReplica, rank) }

// SlabGroup is rank's attention-CP group: the ranks that share L2 slabs.
func (l *Layout) SlabGroup(rank int) []int { return l.GroupOf(KindSlab, rank) }

// Coord returns rank's (dp, cp, tp) coordinates.
func (l *Layout) Coord(rank int) Coord {
	per := l.AttnCP * l.AttnTP
	return Coord{DP: rank / per, CP: rank % per / l.AttnTP, TP: rank % l.AttnTP}
}

// Rank is the inverse of Coord.
func (l *Layout) Rank(c Coord) int {
	return c.DP*l.AttnCP*l.AttnTP + c.CP*l.AttnTP + c.TP
}

func (l *Layout) String() string {
	c := l.Config
	return fmt.Sprintf("world=%d tp=%d dp=%d attn_cp=%d ep=%d dp_attention=%t (attn_dp=%d attn_tp=%d)",
		c.World, c.TP, c.DP, c.AttnCP, c.EP, c.DPAttention, l.AttnDP, l.AttnTP)
}

// SharedSlabGroup is the slab group of rank when the attention-TP ranks of a CP index share
// one slab (a KV layout whose every part is replicated across attention-TP, as MLA's latent):
// the TP-index-0 rank of each CP index of rank's DP block, in CP order. Slab c is made by the
// c-th of them and mapped by every rank of the block, so the block keeps AttnCP slabs in all
// instead of AttnCP × AttnTP. With AttnTP 1 it is SlabGroup(rank). Nil if rank is out of range.
func (l *Layout) SharedSlabGroup(rank int) []int {
	if rank < 0 || rank >= l.Config.World {
		return nil
	}
	d := l.Coord(rank).DP
	return seq(d*l.AttnCP*l.AttnTP, l.AttnCP, l.AttnTP)
}

// SlabSharers are the ranks that map the slabs of SharedSlabGroup(rank): every attention-TP
// and attention-CP rank of rank's DP block (its replica group).
func (l *Layout) SlabSharers(rank int) []int { return l.ReplicaGroup(rank) }

// SharedSlabWriter reports whether rank writes the pages of its slab when slabs are shared
// (SharedSlabGroup): the TP-index-0 rank of each CP index makes the slab, writes every page
// into it and runs its storage I/O; the other TP ranks of the CP index only read it.
func (l *Layout) SharedSlabWriter(rank int) bool {
	return rank >= 0 && rank < l.Config.World && l.Coord(rank).TP == 0
}
