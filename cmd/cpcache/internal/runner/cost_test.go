package runner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
)

// TestCostProfileFollowsTheLayout: a profile with a model derives its figures from the run:
// prefill spreads over the replica's attn-CP × attn-TP GPUs, a rank's KV per token shrinks
// with attn-TP (down to one KV head), and storage bandwidth is per I/O rank, so that CP8
// reads a prefetch 8× faster than CP1 on the virtual clock.
func TestCostProfileFollowsTheLayout(t *testing.T) {
	plan := func(world, cp int, mutate func(*Config)) *Plan {
		cfg := DefaultConfig()
		cfg.Layout = parallel.LayoutConfig{World: world, DP: 1, AttnCP: cp, DPAttention: true}
		if mutate != nil {
			mutate(&cfg)
		}
		p, err := Prepare(cfg)
		require.NoError(t, err)
		return p
	}
	cp1, cp8 := plan(1, 1, nil).Config.Time.Model, plan(8, 8, nil).Config.Time.Model
	// Llama-3.1-8B: 2 × 8.03 G FLOP per token at 40% of 989 TFLOPS on 8 GPUs = 5.07 µs.
	assert.InDelta(t, 2*8.03e9/(989e3*0.4*8), cp8.PrefillNsPerToken, 1e-9)
	assert.InDelta(t, 8, cp1.PrefillNsPerToken/cp8.PrefillNsPerToken, 1e-9, "CP8 computes a token 8× faster than CP1")
	assert.InDelta(t, 8, cp1.AttentionNsPerTokenPair/cp8.AttentionNsPerTokenPair, 1e-9)
	assert.Equal(t, 131072, cp8.KVBytesPerToken, "32 layers × K,V × 8 heads × 128 × 2 bytes")
	assert.Equal(t, "model", cp8.KVSource)
	assert.Equal(t, 512, cp8.RunKVBytesPerToken, "the run's slabs keep --kv-bytes-per-token")
	assert.Contains(t, cp8.String(), "the model's; the run's slabs hold 512 B")

	// The virtual clock of each run: a 64-page prefetch, latency aside.
	read := func(p *Plan) float64 {
		v := newClock(&p.Config)
		return v.StorageReady(0, 64) - p.Config.Time.Model.StorageLatencyUs*1e3
	}
	r1, r8 := read(plan(1, 1, nil)), read(plan(8, 8, nil))
	assert.InDelta(t, 64*16*131072/7.0, r1, 1e-6, "CP1: one I/O rank reads all 64 pages at 7 GB/s")
	assert.InDelta(t, 8, r1/r8, 1e-12, "CP8 reads 8× faster than CP1: each rank its 8 pages")

	prof, err := LoadCostProfile(DefaultCostProfile, "")
	require.NoError(t, err)
	for tp, want := range map[int]int{1: 131072, 2: 65536, 8: 16384, 16: 16384} {
		m, err := prof.Resolve(1, tp, 16, 512, 0)
		require.NoError(t, err)
		assert.Equal(t, want, m.KVBytesPerToken, "attn-TP %d: a rank holds max(8/%d, 1) KV heads", tp, tp)
	}
	m2, err := prof.Resolve(2, 4, 16, 512, 0)
	require.NoError(t, err)
	assert.Equal(t, 8, m2.GPUs)
	assert.InDelta(t, cp8.PrefillNsPerToken, m2.PrefillNsPerToken, 1e-9, "CP2 × TP4 computes on 8 GPUs like CP8")
	assert.InDelta(t, cp8.DecodeStepNs/4, m2.DecodeStepNs, 1e-9, "a decode step reads the weights ÷ attn-TP")

	// A figure of the profile that contradicts its model is refused with both values, at
	// Prepare; a profile without a model takes the run's KV size.
	bad, err := LoadCostProfile(DefaultCostProfile, "kv_bytes_per_token=4096")
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.Time.Cost = bad
	_, err = Prepare(cfg)
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "kv_bytes_per_token 4096 is not the KV of its model Llama-3.1-8B at attn-TP 1")
	assert.Contains(t, err.Error(), "= 131072")
	unit := plan(4, 4, func(c *Config) { c.Time.Cost, _ = LoadCostProfile("unit", ""); c.KVBytesPerToken = 64 }).Config.Time.Model
	assert.Equal(t, 64, unit.KVBytesPerToken)
	assert.Equal(t, "run", unit.KVSource)
	assert.Equal(t, 1000.0, unit.PrefillNsPerToken, "a profile without a model keeps its figures whatever the layout")

	_, err = LoadCostProfile("unit", "model_params_b=8")
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "model_params_b 8 needs a positive model_layers")
	_, err = LoadCostProfile(DefaultCostProfile, "mfu=1.5")
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "mfu 1.5 is over 1")
}

// TestPrefetchSkippedForCost: a second run against the store its first run filled (CP4, the
// synthetic workload of TestSecondRunServesWhatStorageHolds). (a) Where the profile reads a
// page from storage slower than it computes it (0.5 GB/s per I/O rank: 65.5 µs per token
// against a 10.1 µs prefill on 4 GPUs), nothing is prefetched, every stored page beyond the
// L1 and L2 hits is counted skipped for cost (and named so by the miss attribution), and
// TTFT is no worse than with the cache off and better than reading them anyway
// (--prefetch-always). (b) Where storage is faster (7 GB/s per I/O rank), storage serves
// what it holds, nothing skipped, overlapped and with --prefetch-sync.
func TestPrefetchSkippedForCost(t *testing.T) {
	dir := t.TempDir()
	plan := func(overrides string, always, sync bool) *Plan {
		cfg := DefaultConfig()
		cfg.Layout = parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}
		cfg.Synthetic = workload.SyntheticConfig{Clients: 24, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 8, Seed: 5}
		cfg.PageSize, cfg.L1Pages, cfg.L2Pages, cfg.KVBytesPerToken = 8, 24, 64, 8 // L1: 96 pages over the 4 ranks
		cfg.Storage, cfg.PrefetchAlways, cfg.Time.PrefetchSync = "file://"+dir, always, sync
		var err error
		cfg.Time.Cost, err = LoadCostProfile(DefaultCostProfile, overrides)
		require.NoError(t, err)
		p, err := Prepare(cfg)
		require.NoError(t, err)
		return p
	}
	first := plan("", true, false)
	requireAgreed(t, first, runInProcess(t, first, -1)) // fills the store
	stored, _ := storedPrefixes(t, first)
	P := int64(first.Config.PageSize)

	type result struct {
		hitL3, beyond, skipped, missedCost, prefetched int64
		ttftOn, ttftOff                                float64
	}
	second := func(p *Plan) result {
		out := runInProcess(t, p, -1)
		requireAgreed(t, p, out) // the ranks of the replica count alike, skipped pages too
		c := out[0].counts
		on := report.Figures([]report.ReplicaTiming{*out[0].timing}, 0)
		off := report.Figures([]report.ReplicaTiming{report.TimingOf(simulateNoCache(&p.Config, p.Requests))}, 0)
		return result{hitL3: c.HitL3, beyond: stored - c.HitL1 - c.HitL2, skipped: c.PrefetchCostSkippedPages * P,
			missedCost: out[0].timing.Misses.Cost, prefetched: out[0].stats.L3PrefetchedPages, ttftOn: on.TTFTP50Ms, ttftOff: off.TTFTP50Ms}
	}

	// (a)
	for _, sync := range []bool{false, true} {
		p := plan("storage_gbps=0.5", false, sync)
		require.Len(t, p.Warnings, 1)
		assert.Contains(t, p.Warnings[0], "a storage hit is slower than recomputing it")
		r := second(p)
		t.Logf("0.5 GB/s, sync %t: %+v", sync, r)
		require.Greater(t, r.beyond, stored/2, "storage holds much beyond the L1 and L2 hits")
		assert.Zero(t, r.prefetched, "nothing is read from storage slower than the prefill")
		assert.Zero(t, r.hitL3)
		assert.Equal(t, r.beyond, r.skipped, "the stored pages beyond the L1/L2 hits are the ones skipped for cost")
		assert.Equal(t, r.skipped, r.missedCost, "the miss attribution names them")
		assert.LessOrEqual(t, r.ttftOn, r.ttftOff, "TTFT p50 no worse than with the cache off")
	}
	always := second(plan("storage_gbps=0.5", true, true))
	t.Logf("0.5 GB/s, --prefetch-always --prefetch-sync: %+v", always)
	assert.Zero(t, always.skipped)
	assert.GreaterOrEqual(t, float64(always.hitL3), 0.95*float64(always.beyond), "--prefetch-always reads what storage holds")
	assert.Greater(t, always.ttftOn, always.ttftOff, "reading a slow store anyway is slower than the cache off")

	// (b)
	for _, sync := range []bool{false, true} {
		r := second(plan("", false, sync))
		t.Logf("7 GB/s, sync %t: %+v", sync, r)
		assert.Zero(t, r.skipped, "every read pays off")
		assert.GreaterOrEqual(t, float64(r.hitL3), 0.95*float64(r.beyond), "storage serves what it holds")
		if sync {
			assert.Less(t, r.ttftOn, r.ttftOff, "reading a fast store beats computing")
		}
	}
}
