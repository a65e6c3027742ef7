package runner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// inlineTrace writes lines (Mooncake trace JSON objects) as a trace file of the test's.
func inlineTrace(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

// prepareTrace prepares the default plan over the trace at path read at 1/scale.
func prepareTrace(path string, scale int) (*Plan, error) {
	cfg := DefaultConfig()
	cfg.Workload, cfg.TracePath, cfg.TraceScale = WorkloadTrace, path, scale
	return Prepare(cfg)
}

// TestPrepareTraceScale: --trace-scale reads the trace at 1/N of its lengths (each rounded
// up) and says so in the workload's description; a scale that is not a power of two up to
// 512 is bad input naming it. The trace is written here, so the checks run everywhere.
func TestPrepareTraceScale(t *testing.T) {
	path := inlineTrace(t,
		`{"timestamp": 0, "input_length": 1000, "output_length": 97, "hash_ids": [0, 1]}`,
		`{"timestamp": 5, "input_length": 1501, "output_length": 3, "hash_ids": [0, 2, 3]}`)
	requireScaled(t, path, 4)
	for _, scale := range []int{6, 3, -2, 1024} {
		_, err := prepareTrace(path, scale)
		require.ErrorIs(t, err, ErrBadInput, "scale %d", scale)
		assert.Contains(t, err.Error(), fmt.Sprintf("--trace-scale: workload: bad trace scale: %d is not a power of two from 1 to 512", scale))
	}
}

// TestPrepareTraceScaleConversationTrace: TestPrepareTraceScale's lengths on the first
// requests of the Mooncake conversation trace (skipped without it).
func TestPrepareTraceScaleConversationTrace(t *testing.T) {
	requireScaled(t, modelTraceSlice(t, 4, 2048, 100), 4)
}

// requireScaled asserts that the trace at path read at 1/scale has the requests read as
// written, each prompt and answer length divided by scale rounded up, and that only the
// scaled plan's description says it is scaled.
func requireScaled(t *testing.T, path string, scale int) {
	t.Helper()
	full, err := prepareTrace(path, 1)
	require.NoError(t, err)
	scaled, err := prepareTrace(path, scale)
	require.NoError(t, err)
	require.NotEmpty(t, full.Requests)
	require.Len(t, scaled.Requests, len(full.Requests))
	for i, r := range scaled.Requests {
		assert.Equal(t, (len(full.Requests[i].Tokens)+scale-1)/scale, len(r.Tokens), "request %d", i)
		assert.Equal(t, (full.Requests[i].OutputLen+scale-1)/scale, r.OutputLen, "request %d", i)
	}
	assert.Contains(t, scaled.Desc, fmt.Sprintf(", lengths scaled 1/%d", scale))
	assert.NotContains(t, full.Desc, "scaled")
}
