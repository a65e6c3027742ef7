package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/storage"
)

// The reference model as the oracle of the whole cache (issue 28): with --engine model
// every request's output (generated tokens and final logits) is compared with the same
// request computed without the cache, so a run that ends with differing 0 shows the cache
// served correct KV on every path the run took. The tests below drive the paths the
// kvtest engine's page checks cannot judge end to end: L3 hits, every write policy, CP 1 to
// 8 and DP 2, the runner's faults and a trace.

// requireOracle checks what every --engine model run must show: no rank failed, every rank
// of a replica counted what its leader counted, no page check failed, and every request's
// output was checked against the cache-off reference (over the replicas' leaders) with none
// differing.
func requireOracle(t *testing.T, p *Plan, out []rankOutcome) {
	t.Helper()
	var checked, differing int64
	for rank, o := range out {
		require.NoError(t, o.err, "rank %d", rank)
		require.NoError(t, o.firstBad, "rank %d", rank)
		leader := p.Layout.ReplicaGroup(rank)[0]
		assert.Equal(t, out[leader].counts, o.counts, "rank %d counts what its replica leader %d counts", rank, leader)
		assert.Zero(t, o.local.BadPages, "rank %d", rank)
		require.NotNil(t, o.model, "rank %d ran the reference model", rank)
		if leader == rank {
			checked += o.counts.OutputsChecked
			differing += o.counts.OutputsDiffering
		}
	}
	assert.Equal(t, int64(len(p.Requests)), checked, "every request's output is checked")
	assert.Zero(t, differing, "no output differs from the cache-off reference")
}

// leaderCounts sums the replica leaders' counts of f.
func leaderCounts(p *Plan, out []rankOutcome, f func(sched.Counts) int64) int64 {
	var n int64
	for rank, o := range out {
		if p.Layout.ReplicaGroup(rank)[0] == rank {
			n += f(o.counts)
		}
	}
	return n
}

// eachRank asserts cond of every rank's cache statistics.
func eachRank(t *testing.T, out []rankOutcome, what string, cond func(hicache.Stats) bool) {
	t.Helper()
	for rank, o := range out {
		assert.True(t, cond(o.stats), "rank %d: %s (%+v)", rank, what, o.stats.CoreStats)
	}
}

// cpLayout is CP n over n ranks (one DP replica, DP attention).
func cpLayout(n int) parallel.LayoutConfig {
	return parallel.LayoutConfig{World: n, DP: 1, AttnCP: n, DPAttention: true}
}

// oraclePlan is enginePlan (three conversations of three turns, pages of 4 tokens) on
// layout lc with an L1 of 40 pages of the tree (40/CP per rank), so that histories come back
// from L2 at every CP size.
func oraclePlan(t *testing.T, variant string, lc parallel.LayoutConfig, mutate func(*Config)) *Plan {
	return enginePlan(t, variant, func(c *Config) {
		c.Layout, c.L1Pages = lc, 40/lc.AttnCP
		if mutate != nil {
			mutate(c)
		}
	})
}

// TestEngineModelOracleLayoutsAndPolicies: at CP 1, 2, 4 and 8 and at DP 2 (two replicas,
// each its own CP-2 group, serving their own conversations), under each write policy and
// for each model variant (GQA, MLA at CP 8, the side buffer at CP 2), every output equals
// the cache-off reference's, with prefixes served from L1 and loaded back from L2 (so the
// outputs judge the L2 path too).
func TestEngineModelOracleLayoutsAndPolicies(t *testing.T) {
	cases := []struct {
		name, variant string
		layout        parallel.LayoutConfig
		policy        hicache.Policy
	}{
		{"cp1", "gqa", cpLayout(1), hicache.WriteThrough},
		{"cp2/side", "side", cpLayout(2), hicache.WriteThrough},
		{"cp4", "gqa", cpLayout(4), hicache.WriteThrough},
		{"cp8/mla", "mla", cpLayout(8), hicache.WriteThrough},
		{"cp2·dp2", "gqa", parallel.LayoutConfig{World: 4, DP: 2, AttnCP: 2, DPAttention: true}, hicache.WriteThrough},
		{"cp4/write_through_selective", "gqa", cpLayout(4), hicache.WriteThroughSelective},
		{"cp4/write_back", "gqa", cpLayout(4), hicache.WriteBack},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := oraclePlan(t, c.variant, c.layout, func(cfg *Config) {
				cfg.Policy = c.policy
				cfg.Synthetic.Clients = 2 * c.layout.DP // at DP 2 each replica's conversations overflow its L1
			})
			require.Equal(t, c.layout.DP, p.Layout.AttnDP)
			out := runInProcess(t, p, -1)
			requireOracle(t, p, out)
			for d := range p.Layout.AttnDP {
				leader := out[p.Layout.ReplicaGroup(d * p.Layout.AttnCP)[0]].counts
				assert.Positive(t, leader.OutputsChecked, "replica %d checked its outputs", d)
				assert.Positive(t, leader.HitL1, "replica %d: prefixes served from L1", d)
				assert.Positive(t, leader.HitL2, "replica %d: prefixes loaded back from L2", d)
			}
		})
	}
}

// TestEngineModelOracleUnderFaults: each fault the runner injects in-process (--fault; kill
// and stall stop a process, new-fail stops the start: no outputs to judge) happens — its
// counter is positive — and every output still equals the cache-off reference's: a copy
// that fails aborts its backup or makes its load stale, a divergence quarantines and
// recovers, a flush empties the cache (or is refused while it is busy), a failing, hanging
// or frozen storage costs hits only.
func TestEngineModelOracleUnderFaults(t *testing.T) {
	cases := []struct {
		name, spec string
		storage    bool
		happened   func(t *testing.T, p *Plan, out []rankOutcome)
	}{
		{name: "copy-fail", spec: "copy-fail:rank=1,step=20", happened: func(t *testing.T, _ *Plan, out []rankOutcome) {
			eachRank(t, out, "a backup aborted or a load made stale", func(s hicache.Stats) bool { return s.AbortedWrites+s.FailedLoads > 0 })
		}},
		{name: "diverge-tree", spec: "diverge-tree:rank=2,step=30", happened: divergedAndRecovered},
		{name: "diverge-placement", spec: "diverge-placement:rank=1,step=30", happened: divergedAndRecovered},
		{name: "flush now", spec: "flush:step=30", happened: func(t *testing.T, p *Plan, out []rankOutcome) {
			assert.Equal(t, int64(1), leaderCounts(p, out, func(c sched.Counts) int64 { return c.Flushes + c.FlushesRefused }), "the flush was made or refused")
		}},
		{name: "flush when idle", spec: "flush:step=30,when=idle", happened: func(t *testing.T, p *Plan, out []rankOutcome) {
			assert.Equal(t, int64(1), leaderCounts(p, out, func(c sched.Counts) int64 { return c.Flushes }), "the flush was made")
		}},
		{name: "storage-error", spec: "storage-error:after=0s", storage: true, happened: storageFailed},
		{name: "storage-hang", spec: "storage-hang:after=0s,for=1m", storage: true, happened: storageFailed},
		{name: "storage-freeze", spec: "storage-freeze:op=put", storage: true, happened: func(t *testing.T, _ *Plan, out []rankOutcome) {
			var abandoned int64
			for _, o := range out {
				abandoned += o.stats.StorageAbandoned
			}
			assert.Positive(t, abandoned, "storage operations abandoned in the frozen file system")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			faults, err := ParseFaults(c.spec)
			require.NoError(t, err)
			p := oraclePlan(t, "gqa", cpLayout(4), func(cfg *Config) {
				cfg.Faults = faults
				if c.storage {
					cfg.Storage, cfg.StorageTimeout = "file://"+t.TempDir(), 200*time.Millisecond
				}
			})
			opts := inProcessOptions{corruptRank: -1}
			if c.storage { // the storage faults as openRank wraps them
				opts.wrapStorage = func(rank int, st storage.Storage) storage.Storage { return p.Config.faultyStorage(rank, st) }
			}
			out := runInProcessWith(t, p, opts)
			requireOracle(t, p, out)
			c.happened(t, p, out)
		})
	}
}

// divergedAndRecovered: every rank entered a quarantine and recovered from it.
func divergedAndRecovered(t *testing.T, _ *Plan, out []rankOutcome) {
	eachRank(t, out, "diverged, quarantined and recovered", func(s hicache.Stats) bool { return s.Divergences > 0 && s.Recoveries > 0 })
}

// storageFailed: storage calls failed (summed over ranks: each does its own pages' I/O).
func storageFailed(t *testing.T, _ *Plan, out []rankOutcome) {
	var errs int64
	for _, o := range out {
		errs += o.stats.StorageErrors
	}
	assert.Positive(t, errs, "storage calls failed")
}

// TestEngineModelOracleL3: a first run fills a file store; a second run of the same workload
// against it, with a fresh L1 and L2, serves prefixes from storage (L3 hits, pages read and
// verified by every rank); in both every output equals the cache-off reference's, for the GQA
// model (sharded parts) and the MLA one (one replicated part).
func TestEngineModelOracleL3(t *testing.T) {
	for _, variant := range []string{"gqa", "mla"} {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			p := oraclePlan(t, variant, cpLayout(4), func(c *Config) { c.Storage = "file://" + dir })
			first := runInProcess(t, p, -1)
			requireOracle(t, p, first)
			eachRank(t, first, "backed pages up to storage", func(s hicache.Stats) bool { return s.StoragePagesWritten > 0 })
			second := runInProcess(t, p, -1)
			requireOracle(t, p, second)
			assert.Positive(t, second[0].counts.HitL3, "the second run hits in storage")
			eachRank(t, second, "read its pages from storage", func(s hicache.Stats) bool { return s.StoragePagesRead > 0 })
			t.Logf("second run: L1 %d, L2 %d, L3 %d, missed %d prompt tokens", second[0].counts.HitL1, second[0].counts.HitL2, second[0].counts.HitL3, second[0].counts.Missed)
		})
	}
}
