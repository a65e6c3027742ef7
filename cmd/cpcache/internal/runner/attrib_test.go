package runner

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/workload"
)

// writeSmallTrace writes a Mooncake trace of conversation-like requests: chains of turns,
// each turn's blocks the previous turn's plus new ones, some chains sharing a first block,
// prompt lengths not multiples of a page, arrivals a few ms apart.
func writeSmallTrace(t *testing.T, n int) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	var chains [][]int
	next := 100
	var b strings.Builder
	for i := range n {
		var ids []int
		if len(chains) == 0 || rng.IntN(3) == 0 {
			ids = []int{rng.IntN(3)} // a shared "system" block
			chains = append(chains, ids)
		} else {
			c := rng.IntN(len(chains))
			ids = chains[c]
		}
		ids = append(ids[:len(ids):len(ids)], next)
		next++
		chains[rng.IntN(len(chains))] = ids
		in := (len(ids)-1)*workload.BlockTokens + 1 + rng.IntN(workload.BlockTokens-1)
		idText := strings.Trim(strings.ReplaceAll(fmt.Sprint(ids), " ", ", "), "[]")
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n", i*3, in, 1+rng.IntN(6), idText)
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// reuseReference is the test's own reuse bound: requests one at a time, in order; a prompt
// hits each leading whole page whose whole prefix an earlier prompt or prompt-and-answer
// held. Prefixes are compared token for token, as paths in a trie of pages.
func reuseReference(reqs []workload.Request, page int) int64 {
	type edge struct {
		parent int
		page   string
	}
	trie := map[edge]int{} // node ids; the root is 0
	pageKey := func(toks []int32) string { return fmt.Sprint(toks) }
	var hits int64
	for _, r := range reqs {
		node := 0
		for e := page; e <= len(r.Tokens); e += page {
			next, ok := trie[edge{node, pageKey(r.Tokens[e-page : e])}]
			if !ok {
				break
			}
			hits += int64(page)
			node = next
		}
		full := append(append([]int32{}, r.Tokens...), workload.Answer(r)...)
		node = 0
		for e := page; e <= len(full); e += page {
			k := edge{node, pageKey(full[e-page : e])}
			next, ok := trie[k]
			if !ok {
				next = len(trie) + 1
				trie[k] = next
			}
			node = next
		}
	}
	return hits
}

var smallSynthetic = workload.SyntheticConfig{Clients: 6, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 24, Seed: 3}

func attributionPlan(t *testing.T, lc parallel.LayoutConfig, mutate func(*Config)) *Plan {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Layout = lc
	cfg.PageSize, cfg.L1Pages, cfg.L2Pages, cfg.KVBytesPerToken = 16, 2048, 2048, 8
	cfg.Workload, cfg.TracePath = WorkloadTrace, writeSmallTrace(t, 48)
	cfg.Time.Cost, _ = LoadCostProfile("unit", "")
	mutate(&cfg)
	p, err := Prepare(cfg)
	require.NoError(t, err)
	return p
}

// leaderTotals sums the replica leaders' counts and miss causes.
func leaderTotals(p *Plan, out []rankOutcome) (sched.Counts, report.MissCauses) {
	var c sched.Counts
	var m report.MissCauses
	for rank, o := range out {
		if p.Layout.ReplicaGroup(rank)[0] == rank {
			c.InputTokens += o.counts.InputTokens
			c.HitL1 += o.counts.HitL1
			c.HitL2 += o.counts.HitL2
			c.HitL3 += o.counts.HitL3
			c.Missed += o.counts.Missed
			m.Add(o.timing.Misses)
		}
	}
	return c, m
}

func TestMissAttributionMatchesReuseBound(t *testing.T) {
	lc := parallel.LayoutConfig{World: 2, AttnCP: 2}
	cases := []struct {
		name       string
		mutate     func(*Config)
		sequential bool // one request at a time: hits equal the bound exactly
	}{
		{"trace/none/sequential", func(c *Config) { c.Time.Mode, c.MaxRunning = TimeNone, 1 }, true},
		{"synthetic/none/sequential", func(c *Config) {
			c.Workload, c.TracePath, c.Time.Mode, c.MaxRunning = WorkloadSynthetic, "", TimeNone, 1
			c.Synthetic = smallSynthetic
		}, true},
		{"trace/none/concurrent", func(c *Config) { c.Time.Mode, c.MaxRunning = TimeNone, 8 }, false},
		{"trace/virtual/concurrent", func(c *Config) { c.Time.Mode, c.MaxRunning = TimeVirtual, 8 }, false},
		{"synthetic/none/concurrent", func(c *Config) {
			c.Workload, c.TracePath, c.Time.Mode, c.MaxRunning = WorkloadSynthetic, "", TimeNone, 6
			c.Synthetic = smallSynthetic
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := attributionPlan(t, lc, tc.mutate)
			out := runInProcess(t, p, -1)
			requireAgreed(t, p, out)
			c, m := leaderTotals(p, out)
			ref := reuseReference(p.Requests, p.Config.PageSize)
			require.Positive(t, ref, "the workload reuses prefixes")
			hits := c.HitL1 + c.HitL2 + c.HitL3
			assert.Equal(t, c.Missed, m.Total(), "the causes sum to the tokens missed: %+v", m)
			assert.Zero(t, m.CapacityL1+m.CapacityL2+m.Storage+m.Quarantined, "unlimited capacity, no storage, no divergence: %+v", m)
			assert.Positive(t, m.Compulsory)
			assert.Positive(t, m.PartialPage)
			if tc.sequential {
				assert.Equal(t, ref, hits, "one at a time, hits are the reuse bound")
				assert.Zero(t, m.InFlight)
			}
			assert.Equal(t, ref, hits+m.InFlight, "hits plus in-flight misses are the reuse bound")
			assert.Equal(t, ref, workload.ReuseBound(p.Requests, p.Config.PageSize), "workload.ReuseBound agrees with the test's reference")
		})
	}
}

func TestMissAttributionUnderCapacity(t *testing.T) {
	// L1 of 160 pages (2 × the largest request) and 100 L2 pages in each of 2 slabs: far less
	// than the trace's distinct pages, so pages leave the cache and come back as misses.
	p := attributionPlan(t, parallel.LayoutConfig{World: 2, AttnCP: 2}, func(c *Config) { c.L1Pages, c.L2Pages = 200, 100 })
	out := runInProcess(t, p, -1)
	requireAgreed(t, p, out)
	c, m := leaderTotals(p, out)
	assert.Equal(t, c.Missed, m.Total(), "the causes sum to the tokens missed: %+v", m)
	assert.Positive(t, m.CapacityL2, "evicted from L2: %+v", m)
	ref := reuseReference(p.Requests, p.Config.PageSize)
	assert.Equal(t, ref, c.HitL1+c.HitL2+m.CapacityL1+m.CapacityL2+m.InFlight, "every reusable token is a hit, or a capacity or in-flight miss")
}

func TestMissAttributionCountsQuarantine(t *testing.T) {
	// Rank 1 perturbs its tree before step 40: every rank quarantines (no hits) and recovers
	// with a flush at the first idle step; misses of cached pages meanwhile, and of pages the
	// flush dropped, are quarantined.
	faults, err := ParseFaults("diverge-tree:rank=1,step=40")
	require.NoError(t, err)
	p := attributionPlan(t, parallel.LayoutConfig{World: 2, AttnCP: 2}, func(c *Config) { c.Faults = faults })
	out := runInProcess(t, p, -1)
	for rank, o := range out {
		require.NoError(t, o.err, "rank %d", rank)
	}
	c, m := leaderTotals(p, out)
	assert.Equal(t, c.Missed, m.Total(), "the causes sum to the tokens missed: %+v", m)
	assert.Positive(t, m.Quarantined, "%+v", m)
	ref := reuseReference(p.Requests, p.Config.PageSize)
	assert.Equal(t, ref, c.HitL1+c.HitL2+m.Quarantined+m.InFlight, "unlimited capacity: every reusable token is a hit or quarantined")
}
