package runner

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/workload"
)

// TestEngineModelOracleTrace: a slice of the Mooncake conversation trace (its first 32
// requests of up to 2 K prompt tokens, each sharing its first 512-token block with the
// others, answers cut to 64 tokens) read at 1/8 of its lengths (--trace-scale 8: blocks of 64
// tokens, prompts of up to 256, answers of up to 8 tokens — the model computes every token)
// on its virtual clock at CP 2: every output equals the cache-off reference's, the shared
// block served from the cache.
func TestEngineModelOracleTrace(t *testing.T) {
	path := modelTraceSlice(t, 32, 2048, 64)
	p := oraclePlan(t, "gqa", cpLayout(2), func(c *Config) {
		c.Workload, c.TracePath, c.TraceScale, c.Synthetic = WorkloadTrace, path, 8, workload.SyntheticConfig{}
		c.PageSize, c.L1Pages, c.L2Pages = 16, 16, 64
	})
	require.Len(t, p.Requests, 32)
	out := runInProcess(t, p, -1)
	requireOracle(t, p, out)
	// Every request of the slice shares its first block (64 tokens here) and nothing more
	// with those before it: the unlimited bound, one request at a time, is that block for
	// every request but the first, and the cache serves exactly it.
	block := p.traceBlockTokens()
	require.Equal(t, 64, block)
	shared := workload.ReuseBound(p.Requests, p.Config.PageSize)
	require.Equal(t, int64((len(p.Requests)-1)*block), shared, "the slice shares only its first block")
	c := out[0].counts
	assert.Equal(t, shared, c.HitL1+c.HitL2, "every request but the first hits the shared block, nothing more")
	// The report's LRU reference counts the trace's 64-token blocks: it too serves the shared one.
	ref := referenceOf(p)
	assert.Equal(t, block, ref.BlockSize())
	assert.Equal(t, shared, ref.LRUBlockTokens, "an LRU of 64-token blocks serves the shared block")
	t.Logf("%d requests, %d prompt tokens: L1 %d, L2 %d, missed %d", len(p.Requests), c.InputTokens, c.HitL1, c.HitL2, c.Missed)
}

// modelTraceSlice writes the first n requests of the conversation trace with prompts of at
// most maxInput tokens, their answers cut to at most maxOutput tokens (the test skips
// without the trace).
func modelTraceSlice(t *testing.T, n, maxInput, maxOutput int) string {
	t.Helper()
	path := shortTrace(t, n, maxInput)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []byte
	for line := range bytes.Lines(b) {
		var r map[string]any
		require.NoError(t, json.Unmarshal(line, &r))
		r["output_length"] = min(int(r["output_length"].(float64)), maxOutput)
		l, err := json.Marshal(r)
		require.NoError(t, err)
		out = append(append(out, l...), '\n')
	}
	require.NoError(t, os.WriteFile(path, out, 0o600))
	return path
}

// TestPrepareTraceScale: --trace-scale reads the trace at 1/N of its lengths and says so
// in the workload's description; a scale that is not a power of two up to 512 is bad input
// naming it.
func TestPrepareTraceScale(t *testing.T) {
	path := modelTraceSlice(t, 4, 2048, 100)
	plan := func(scale int) (*Plan, error) {
		cfg := DefaultConfig()
		cfg.Workload, cfg.TracePath, cfg.TraceScale = WorkloadTrace, path, scale
		return Prepare(cfg)
	}
	full, err := plan(1)
	require.NoError(t, err)
	scaled, err := plan(4)
	require.NoError(t, err)
	require.Len(t, scaled.Requests, len(full.Requests))
	for i, r := range scaled.Requests {
		assert.Equal(t, (len(full.Requests[i].Tokens)+3)/4, len(r.Tokens), "request %d", i)
		assert.Equal(t, (full.Requests[i].OutputLen+3)/4, r.OutputLen, "request %d", i)
	}
	assert.Contains(t, scaled.Desc, ", lengths scaled 1/4")
	assert.NotContains(t, full.Desc, "scaled")
	_, err = plan(6)
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "--trace-scale: workload: bad trace scale: 6 is not a power of two from 1 to 512")
}
