package runner

import (
	"context"
	"math"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/hostmem"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/sim/vtime"
)

// Upper bounds of the configuration, so that no product of them overflows and a typo is a
// clear error instead of an impossible job.
const (
	MaxPageTokens        = 1 << 20                  // tokens per page
	MaxKVBytesPerToken   = vtime.MaxKVBytesPerToken // bytes of one rank's KV shard per token
	MaxPagesPerPool      = math.MaxInt32
	MaxBatchTokens       = 1 << 30
	MaxRunningPerReplica = 1 << 20
)

// checkBounds rejects values over their bound; with them, every size below fits an int64.
func (c *Config) checkBounds() error {
	for _, v := range []struct {
		name   string
		v, max int
	}{{"page size", c.PageSize, MaxPageTokens}, {"KV bytes per token", c.KVBytesPerToken, MaxKVBytesPerToken},
		{"L1 pages", c.L1Pages, MaxPagesPerPool}, {"L2 pages", c.L2Pages, MaxPagesPerPool},
		{"batch tokens", c.BatchTokens, MaxBatchTokens}, {"max running", c.MaxRunning, MaxRunningPerReplica}} {
		if v.v > v.max {
			return bad("%s %d is over the limit of %d", v.name, v.v, v.max)
		}
	}
	return nil
}

// checkStore checks an explicit rendezvous store URL (reachable, usable) so that a bad one
// is a bad input before any rank starts; the error never quotes a password.
func (c *Config) checkStore() error {
	if c.Store == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	if err := gloo.CheckStore(ctx, c.Store); err != nil {
		return bad("--store %s: %v", redact.URL(c.Store), redact.Error(err, c.Store))
	}
	return nil
}

// RankBytes is the host memory one rank needs at least: its L1 pool, its L2 slab and its copy
// of the workload's prompt tokens. With --device cuda the L1 pool is device memory, and so is
// the L2 slab with --l2 device: they count 0 here.
func (p *Plan) RankBytes() (l1, l2, workload int64) {
	c := &p.Config
	page := int64(c.PageBytes())
	tokens := int64(0)
	for _, r := range p.Requests {
		tokens += int64(len(r.Tokens))
	}
	l1, l2 = int64(c.L1Pages)*page, int64(c.L2Pages)*page
	if c.Device == DeviceCUDA {
		l1 = 0
		if c.L2 == L2Device {
			l2 = 0
		}
	}
	return l1, l2, 4 * tokens
}

// CheckHost checks that localRanks ranks of the plan fit this host's available memory
// (MemAvailable, and the tightest cgroup memory limit of its cgroup and its ancestors, v2 or
// v1: see hostmem.Available). The L2 slabs are anonymous shared
// memory (memfd), which counts against the same memory and not against /dev/shm.
func (p *Plan) CheckHost(localRanks int) error {
	avail, source, ok := hostmem.Available()
	if !ok {
		return nil
	}
	l1, l2, wl := p.RankBytes()
	per := l1 + l2 + wl
	if need := int64(localRanks) * per; per > 0 && (need/per != int64(localRanks) || need > avail) {
		return bad("%d local ranks need %s (per rank: L1 %d pages %s, L2 slab %d pages %s, workload %s), more than the %s of memory available (%s)",
			localRanks, hostmem.GiB(float64(localRanks)*float64(per)), p.Config.L1Pages, hostmem.GiB(float64(l1)), p.Config.L2Pages, hostmem.GiB(float64(l2)), hostmem.GiB(float64(wl)), hostmem.GiB(float64(avail)), source)
	}
	return nil
}
