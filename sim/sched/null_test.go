package sched

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

func offConfig(t *testing.T, mode string, overrides string) Config {
	t.Helper()
	p, err := vtime.LoadCostProfile("unit", overrides)
	require.NoError(t, err)
	m, err := p.Resolve(2, 1, 16, 64, 0)
	require.NoError(t, err)
	return Config{PageSize: 16, L1Pages: 256, BatchTokens: 1024, MaxRunning: 8, Policy: hicache.WriteThrough, Time: mode, Speed: 1, Cost: m}
}

func offRequests(t *testing.T) []workload.Request {
	t.Helper()
	reqs, err := workload.Synthetic(workload.SyntheticConfig{Clients: 6, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 8, TurnGapMs: 3, Seed: 3})
	require.NoError(t, err)
	return reqs
}

// TestCacheOffComputesEveryToken is the invariant the cache-off figures rest on: over the
// NullCache the scheduler serves every request once, in its conversation's order, hits
// nothing and computes every prompt token, and leaves the requests it was given as they were.
func TestCacheOffComputesEveryToken(t *testing.T) {
	reqs := offRequests(t)
	given := slices.Clone(reqs)
	for _, mode := range []string{vtime.Virtual, vtime.None} {
		v, err := CacheOff(context.Background(), offConfig(t, mode, ""), reqs)
		require.NoError(t, err)
		assert.Equal(t, given, reqs, "%s: the requests are not reordered", mode)
		var prompt int64
		for _, r := range reqs {
			prompt += int64(len(r.Tokens))
		}
		assert.Equal(t, prompt, v.Computed(), mode)
		require.Len(t, v.Timings(), len(reqs), mode)
		seen := map[int32]bool{}
		lastTurn := map[int]int64{} // client → end of its last turn's first token
		byID := map[int32]workload.Request{}
		for _, r := range reqs {
			byID[int32(r.ID)] = r
		}
		for _, tm := range v.Timings() {
			assert.False(t, seen[tm.ID], "%s: request %d served once", mode, tm.ID)
			seen[tm.ID] = true
			assert.Zero(t, tm.HitL1+tm.HitL2+tm.HitL3, "%s: request %d hits nothing", mode, tm.ID)
			r := byID[tm.ID]
			end := tm.ArrivalNs + tm.TTFTNs
			if prev, ok := lastTurn[r.Client]; ok {
				assert.Greater(t, end, prev, "%s: request %d comes after its conversation's previous turn", mode, tm.ID)
			}
			lastTurn[r.Client] = end
		}
	}
}

// TestCacheOffChargesOnlyCompute: over the NullCache nothing is loaded, backed up or read
// from storage, so with free decode steps a run served back to back lasts exactly its
// prompts' prefill; and a run configured with storage is the same run.
func TestCacheOffChargesOnlyCompute(t *testing.T) {
	reqs := offRequests(t)
	cfg := offConfig(t, vtime.None, "decode_step_ns=0,decode_ns_per_request=0")
	v, err := CacheOff(context.Background(), cfg, reqs)
	require.NoError(t, err)
	var want float64
	for _, r := range reqs {
		want += cfg.Cost.PrefillNs(len(r.Tokens), 0)
	}
	assert.InDelta(t, want, v.MakespanNs(), 1e-6*want)

	cfg = offConfig(t, vtime.Virtual, "")
	off, err := CacheOff(context.Background(), cfg, reqs)
	require.NoError(t, err)
	cfg.Storage = true
	stored, err := CacheOff(context.Background(), cfg, reqs)
	require.NoError(t, err)
	assert.Equal(t, off.Timings(), stored.Timings())
	assert.Equal(t, off.MakespanNs(), stored.MakespanNs())
}
