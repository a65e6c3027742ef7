package hicache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvtest"
)

// errInjected is the error of injected transfer failures.
var errInjected = errors.New("injected transfer failure")

// l1IO writes and reads this rank's L1 pages (host memory, or device memory in GPU tests).
type l1IO interface {
	write(slot int32, fill func([]byte)) error
	read(slot int32) ([]byte, error)
}

// hostL1 is the L1 of a host engine.
type hostL1 struct{ c *Cache }

func (h hostL1) write(slot int32, fill func([]byte)) error {
	b, err := h.c.L1Page(slot)
	if err == nil {
		fill(b)
	}
	return err
}

func (h hostL1) read(slot int32) ([]byte, error) { return h.c.L1Page(slot) }

// stepRecord is what one rank reports after a step of a workload.
type stepRecord struct {
	state, placement uint64
	l2               bool
}

// rankWorkload is one rank's random scheduler: every decision comes from a generator seeded
// with seed (so every rank makes the same calls), local eviction hints from one seeded with
// (seed, rank). It fills the pages it owns, verifies every device page it owns after each
// match, checks the structural invariants after each step and records the digests.
func rankWorkload(ctx context.Context, c *Cache, io l1IO, shard, steps int, seed uint64, flushEvery int) ([]stepRecord, map[string]int, error) {
	if io == nil {
		io = hostL1{c}
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	local := rand.New(rand.NewPCG(seed, uint64(1000+c.CPRank()+shard*64)))
	P := c.core.Config().PageSize
	seqs := kvtest.RandomSequences(rng, 40, P)
	var locked []Handle
	counts := map[string]int{}
	var recs []stepRecord
	step := func() error {
		err := c.Step(ctx)
		if ierr := c.core.CheckInvariants(); ierr != nil {
			return ierr
		}
		recs = append(recs, stepRecord{c.StateDigest(), c.core.Allocator().Digest(), !c.core.Quarantined()})
		return err
	}
	for s := 0; s < steps; s++ {
		for k := rng.IntN(3); k >= 0; k-- {
			tokens := seqs[rng.IntN(rng.IntN(len(seqs))+1)] // skewed: low indices are hot
			switch op := rng.IntN(12); {
			case op < 4:
				res, err := c.Insert(Request{Tokens: tokens})
				if errors.Is(err, ErrL1Full) {
					counts["l1full"]++
				} else if err != nil {
					return recs, counts, err
				}
				for _, f := range res.Fill {
					if c.Owns(f.Index) {
						if err := io.write(f.Slot, func(b []byte) { kvtest.FillKV(b, f.Hash.Index(), f.Index, shard) }); err != nil {
							return recs, counts, err
						}
					}
				}
			case op < 9:
				m, err := matchLoadVerify(ctx, c, io, tokens, shard, rng.IntN(4) > 0, step)
				if err != nil {
					return recs, counts, err
				}
				if m.HostPages > 0 {
					counts["hosthit"]++
				}
				if m.DevicePages > 0 && len(locked) < 3 && rng.IntN(2) == 0 {
					if err := c.Lock(m.Last); err != nil {
						return recs, counts, err
					}
					locked = append(locked, m.Last)
				}
			case op < 10 && len(locked) > 0:
				j := rng.IntN(len(locked))
				if err := c.Unlock(locked[j]); err != nil {
					return recs, counts, err
				}
				locked = slices.Delete(locked, j, j+1)
			default:
				if _, _, err := c.EvictL1(rng.IntN(12)); err != nil {
					return recs, counts, err
				}
				if _, err := c.EvictL2(rng.IntN(12) * rng.IntN(2)); err != nil {
					return recs, counts, err
				}
			}
		}
		if local.IntN(100) == 0 {
			c.HintEvict(local.IntN(6), local.IntN(6))
		}
		if err := step(); err != nil {
			return recs, counts, err
		}
		if last := s == steps-1; last || flushEvery > 0 && s%flushEvery == flushEvery-1 {
			for _, n := range locked {
				if err := c.Unlock(n); err != nil {
					return recs, counts, err
				}
			}
			locked = nil
			for k := 0; c.Pending() > 0; k++ {
				if k > 100000 {
					return recs, counts, errors.New("cache never drained")
				}
				if err := step(); err != nil {
					return recs, counts, err
				}
			}
			if last {
				break
			}
			if err := c.Flush(ctx); err != nil {
				return recs, counts, err
			}
			fresh, err := core.New(c.core.Config())
			if err != nil {
				return recs, counts, err
			}
			if c.StateDigest() != fresh.StateDigest() || c.core.Allocator().Digest() != fresh.Allocator().Digest() {
				return recs, counts, fmt.Errorf("after flush: state digest %#x, placement %#x; fresh %#x, %#x",
					c.StateDigest(), c.core.Allocator().Digest(), fresh.StateDigest(), fresh.Allocator().Digest())
			}
			counts["flush"]++
		}
	}
	return recs, counts, nil
}

// loadBackAndWait loads the host part of match m back, makes steps until the group agrees
// the loads are over (they start at the Step after LoadBack), and matches again: a load that
// failed on any rank is stale on every rank by then, so every rank gets the same hit.
func loadBackAndWait(c *Cache, tokens []int32, m MatchResult, step func() error) (MatchResult, error) {
	lr, err := c.LoadBack(m.Last)
	if err != nil && !errors.Is(err, ErrL1Full) {
		return m, err
	}
	if lr.Pages == 0 {
		return m, nil
	}
	for c.LoadPending(m.Last) {
		if err := step(); err != nil {
			return m, err
		}
	}
	last, err := c.Node(m.Last)
	if err != nil {
		return m, err
	}
	return c.Match(Request{Tokens: tokens, Key: last.Key}) // a host hit's node has the match's isolation key
}

// matchLoadVerify matches tokens, loads the host part back when asked (stepping with step),
// waits for this rank's copies and verifies every device page this rank owns.
func matchLoadVerify(ctx context.Context, c *Cache, io l1IO, tokens []int32, shard int, load bool, step func() error) (MatchResult, error) {
	m, err := c.Match(Request{Tokens: tokens})
	if err != nil {
		return m, err
	}
	if load && m.HostPages > 0 {
		if m, err = loadBackAndWait(c, tokens, m, step); err != nil {
			return m, err
		}
	}
	if err := c.WaitL1(ctx, m.Last); errors.Is(err, errInjected) {
		return m, nil // this rank's copy failed: the group marks the node stale next step
	} else if err != nil {
		return m, err
	}
	return m, verifyOwnPages(c, m, shard, io.read)
}

// verifyOwnPages checks the content, read through read, of the device pages of match m that
// this rank (c, holding KV shard shard) owns.
func verifyOwnPages(c *Cache, m MatchResult, shard int, read func(slot int32) ([]byte, error)) error {
	pages := m.DevicePages
	path, err := pathTo(c, m.Last)
	if err != nil {
		return err
	}
	for _, n := range path {
		for j := 0; j < n.Pages() && pages > 0; j++ {
			pages--
			idx := n.Depth + j
			if !c.Owns(idx) {
				continue
			}
			b, err := read(n.L1[j])
			if err != nil {
				return err
			}
			if err := kvtest.CheckKV(b, n.Hashes[j].Index(), idx, shard); err != nil {
				return fmt.Errorf("CP rank %d node %d: %w", c.CPRank(), n.ID, err)
			}
		}
	}
	return nil
}

// compareRecords checks that every rank recorded the same digests at every step.
func compareRecords(recs [][]stepRecord) error {
	for i, r := range recs {
		if len(r) != len(recs[0]) {
			return fmt.Errorf("rank %d made %d steps, rank 0 %d", i, len(r), len(recs[0]))
		}
		for s := range r {
			a, b := r[s], recs[0][s]
			if a.state != b.state || a.l2 != b.l2 || a.l2 && a.placement != b.placement {
				return fmt.Errorf("step %d: rank %d digests %#x/%#x, rank 0 %#x/%#x", s, i, a.state, a.placement, b.state, b.placement)
			}
		}
	}
	return nil
}

// pathTo returns copies of the nodes from the root's child down to the node h names.
func pathTo(c *Cache, h Handle) ([]NodeInfo, error) {
	var p []NodeInfo
	for {
		n, err := c.Node(h)
		if err != nil {
			return nil, err
		}
		if n.Parent == 0 { // the root
			break
		}
		p = append(p, n)
		h = n.Parent
	}
	slices.Reverse(p)
	return p, nil
}
