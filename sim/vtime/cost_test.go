package vtime

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBreakEven: the break-even prompt length solves latency + storage time = prefill time
// (linear and attention), storage per token faster than prefill needs no warning, slower
// does, and without an attention term slower never pays off.
func TestBreakEven(t *testing.T) {
	resolve := func(name, overrides string, cp int) CostModel {
		p, err := LoadCostProfile(name, overrides)
		require.NoError(t, err)
		m, err := p.Resolve(cp, 1, 16, 64)
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
