package hicache

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/parallel"
)

// SlabSet is the L2 of this rank's slab group as the cache sees it (slab.Set and
// kvtest.MemSlabs implement it).
type SlabSet interface {
	// Ranks are the global ranks of the slab group; slab s was created by Ranks()[s].
	Ranks() []int
	// PageSize is the size of one L2 page in bytes.
	PageSize() int
	// PagesPerSlab is the number of pages in each slab.
	PagesPerSlab() int
}

// slabGroupName names the slab group: its parallel.Group's name when the set remembers it.
func slabGroupName(s SlabSet) string {
	if g, ok := s.(interface{ Group() parallel.Group }); ok && g.Group() != nil {
		return g.Group().Name()
	}
	return parallel.GroupName("slab", s.Ranks())
}

// checkScope enforces that consensus runs where it must: every member of the slab group is
// in the consensus group, the consensus group is the layout's replica group of rank, and the
// slab set is the layout's slab group of rank. A size-1 consensus group therefore passes
// only when the layout replicates nothing (its replica group is the rank alone). With shared
// slabs (Config.ShareSlabs) the slab set is the layout's SharedSlabGroup of rank, and every
// rank that maps it (SlabSharers: its makers and their attention-TP peers) must be in the
// consensus group too: they all read pages only the makers write.
func checkScope(l *parallel.Layout, rank int, g parallel.Group, s SlabSet, shared bool) error {
	if l == nil || g == nil || s == nil {
		return fmt.Errorf("%w: layout, consensus group and slab set are required (layout %v, group %v, slabs %v)", ErrBadConfig, l != nil, g != nil, s != nil)
	}
	if rank < 0 || rank >= l.Config.World {
		return fmt.Errorf("%w: rank %d outside world of %d", ErrBadConfig, rank, l.Config.World)
	}
	cons, slabRanks := g.Ranks(), s.Ranks()
	if g.Rank() < 0 || g.Rank() >= len(cons) || cons[g.Rank()] != rank {
		return fmt.Errorf("%w: consensus group %s has rank %d at its position %d, not this rank %d", ErrScope, g.Name(), at(cons, g.Rank()), g.Rank(), rank)
	}
	for _, r := range slabRanks {
		if !slices.Contains(cons, r) {
			return fmt.Errorf("%w: rank %d of slab group %s is missing from consensus group %s (consensus must run on the replica group %s, which contains the slab group)",
				ErrScope, r, slabGroupName(s), g.Name(), parallel.GroupName("replica", l.ReplicaGroup(rank)))
		}
	}
	want := l.SlabGroup(rank)
	if shared {
		want = l.SharedSlabGroup(rank)
		for _, r := range l.SlabSharers(rank) {
			if !slices.Contains(cons, r) {
				return fmt.Errorf("%w: rank %d, which shares slab group %s, is missing from consensus group %s (consensus must run on the replica group %s, which contains every rank that shares the slabs)",
					ErrScope, r, slabGroupName(s), g.Name(), parallel.GroupName("replica", l.ReplicaGroup(rank)))
			}
		}
	}
	if !slices.Equal(slabRanks, want) {
		return fmt.Errorf("%w: slab group %s of rank %d is not the layout's slab group %s (%s)", ErrScope, slabGroupName(s), rank, parallel.GroupName("slab", want), l)
	}
	if want := l.ReplicaGroup(rank); !slices.Equal(cons, want) {
		return fmt.Errorf("%w: consensus group %s of rank %d is not the layout's replica group %s (%s); slab group %s",
			ErrScope, g.Name(), rank, parallel.GroupName("replica", want), l, slabGroupName(s))
	}
	return nil
}

// isReplicaGroup reports whether g is the layout's replica group of rank, with rank at its
// position: the group whose every member calls New with it, so that New's first collective
// on it meets theirs.
func isReplicaGroup(l *parallel.Layout, rank int, g parallel.Group) bool {
	if l == nil || g == nil || rank < 0 || rank >= l.Config.World {
		return false
	}
	cons := g.Ranks()
	return at(cons, g.Rank()) == rank && slices.Equal(cons, l.ReplicaGroup(rank))
}

func at(s []int, i int) int {
	if i < 0 || i >= len(s) {
		return -1
	}
	return s[i]
}
