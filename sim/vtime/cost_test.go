package vtime

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/workload"
)

// TestBreakEven: the break-even prompt length solves latency + storage time = prefill time
// (linear and attention), storage per token faster than prefill needs no warning, slower
// does, and without an attention term slower never pays off.
func TestBreakEven(t *testing.T) {
	resolve := func(name, overrides string, cp int) CostModel {
		p, err := LoadCostProfile(name, overrides)
		require.NoError(t, err)
		m, err := p.Resolve(cp, 1, 16, 64, 0)
		require.NoError(t, err)
		return m
	}
	check := func(m CostModel, b BreakEven) {
		t.Helper()
		n := b.MinPromptTokens
		s := float64(m.KVBytesPerToken) / (float64(m.CP) * m.StorageGBps)
		lhs := m.StorageLatencyUs*1e3 + s*n
		rhs := m.PrefillNsPerToken*n + m.AttentionNsPerTokenPair*n*n/2
		assert.InDelta(t, 1, lhs/rhs, 1e-9, "at %.0f tokens reading and computing take as long", n)
	}
	fast := resolve(DefaultCostProfile, "", 4)
	b := fast.BreakEven()
	check(fast, b)
	assert.False(t, b.StorageSlower)
	assert.Empty(t, b.Warning("x"))
	// CP4: 4 ranks × 7 GB/s over 128 KiB = 214 K tokens/s; prefill 98.5 K tokens/s.
	assert.InDelta(t, 4*7e9/131072, b.StorageTokensPerS, 1e-6)
	assert.InDelta(t, 1e9/fast.PrefillNsPerToken, b.PrefillTokensPerS, 1e-9)
	assert.Less(t, b.MinPromptTokens, float64(SGLangPrefetchThreshold), "NVMe per rank pays off below SGLang's 256 tokens")

	slow := resolve(DefaultCostProfile, "storage_gbps=0.5", 4)
	b = slow.BreakEven()
	check(slow, b)
	assert.True(t, b.StorageSlower)
	assert.Greater(t, b.MinPromptTokens, 100000.0, "at 0.5 GB/s per rank only prompts of hundreds of K tokens pay off")
	assert.Contains(t, b.Warning("slow"), "a storage hit is slower than recomputing it")

	never := resolve("unit", "storage_gbps=0.001", 4)
	b = never.BreakEven()
	assert.True(t, b.Never)
	assert.Contains(t, b.Warning("never"), "no prefetch pays off")
}

// TestHostHitOverlapsLoadWithComputePerLayer: a step that prefills a request whose long
// prefix was a host hit is charged copy then compute when loads complete whole (no layers),
// and with 32 layers max(compute, copy) per layer: the pipeline of 32 layers ends after the
// longer of the two plus one layer of the shorter.
func TestHostHitOverlapsLoadWithComputePerLayer(t *testing.T) {
	p, err := LoadCostProfile(DefaultCostProfile, "")
	require.NoError(t, err)
	// A 4096-token prompt whose first 4000 tokens (250 pages of 16) are held in L2 and load
	// back in the step that computes the other 96.
	const prompt, hit, pages = 4096, 4000, 250
	r := workload.Request{Tokens: make([]int32, prompt)}
	step := func(layers int) (ns, compute, copyNs float64) {
		m, err := p.Resolve(1, 1, 16, 0, layers)
		require.NoError(t, err)
		v := NewClock(&m, None, 1)
		v.BeginStep()
		v.Prefilled(r, 0, hit, 0)
		v.Loaded(pages)
		v.EndStep()
		return v.NowNs(), m.PrefillNs(prompt, hit), CopyNs(pages*m.PageBytes(), m.H2DGBps)
	}
	serial, compute, copyNs := step(0)
	assert.InDelta(t, compute+copyNs, serial, 1e-6, "without layers: the copy, then the compute")
	one, _, _ := step(1)
	assert.InDelta(t, serial, one, 1e-6, "one layer is the whole load")
	layered, _, _ := step(32)
	long, short := max(compute, copyNs), min(compute, copyNs)
	assert.InDelta(t, long+short/32, layered, 1e-6, "32 layers: max(compute, copy) per layer plus one layer of the shorter")
	// 250 pages × 16 × 128 KiB = 500 MiB at 55 GB/s ≈ 9.5 ms of copy against ≈ 4.4 ms of
	// prefill and attention: the layered step is about the copy alone, and saves 31/32 of
	// the compute.
	assert.Greater(t, copyNs, compute)
	assert.InDelta(t, compute*31/32, serial-layered, 1e-6, "layered %.3f ms vs serial %.3f ms", layered/1e6, serial/1e6)
	t.Logf("host hit of %d pages: compute %.2f ms, copy %.2f ms; serial %.2f ms, 32 layers %.2f ms (%.2f×)",
		pages, compute/1e6, copyNs/1e6, serial/1e6, layered/1e6, layered/serial)

	_, err = p.Resolve(1, 1, 16, 0, -1)
	require.ErrorIs(t, err, ErrBadProfile)
	assert.Contains(t, err.Error(), "-1 layers")
}

// TestLoadComputeNs: the pipeline's length whichever side is longer, and no overlap without
// layers or without a load.
func TestLoadComputeNs(t *testing.T) {
	m := CostModel{Layers: 4}
	assert.InDelta(t, 100+20/4.0, m.LoadComputeNs(100, 20), 1e-9, "compute-bound: the first layer's copy is not hidden")
	assert.InDelta(t, 100+20/4.0, m.LoadComputeNs(20, 100), 1e-9, "copy-bound: the last layer's compute is not hidden")
	assert.InDelta(t, 50.0, m.LoadComputeNs(50, 0), 1e-9)
	m.Layers = 0
	assert.InDelta(t, 120.0, m.LoadComputeNs(100, 20), 1e-9)
	assert.Contains(t, (&CostModel{Layers: 32, CP: 1}).String(), "load-backs overlap compute layer by layer (32 layers)")
	assert.NotContains(t, (&CostModel{CP: 1}).String(), "layer by layer")
}
