package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
)

// modelRunArgs is a small `cpcache run --engine model` of real rank processes: 4 ranks at
// CP 4, two conversations of two turns (the model's turns: prompts of up to 272 tokens, 18
// pages with the answer) over 5 L1 pages per rank (20 of the tree), so the second turns come
// back from L2 too.
var modelRunArgs = []string{"--engine", "model", "--world", "4", "--dp", "1", "--attn-cp", "4",
	"--clients", "2", "--rounds", "2", "--l1-pages", "5", "--l2-pages", "64"}

// requireModelOracle asserts what a healthy --engine model run of the binary shows: a sound
// run (requireSound) whose pages loaded back were judged by the outputs they produced, not
// one by one (pages verified is 0), and every request's output checked against the cache-off
// reference with none differing, in the JSON report and in the text one.
func requireModelOracle(t *testing.T, variant string, status int, rep *report.Report, out, errOut string) {
	t.Helper()
	requireSound(t, status, rep, out, errOut)
	assert.Zero(t, rep.PagesVerified, "the outputs judge the loaded pages")
	require.NotNil(t, rep.Model, "the report has the reference model's check")
	assert.Equal(t, variant, rep.Model.Variant)
	assert.Equal(t, rep.Requests, rep.Model.OutputsChecked, "every request's output is checked")
	assert.Zero(t, rep.Model.OutputsDiffering)
	assert.Contains(t, out, fmt.Sprintf("  reference model      %s: outputs checked %d, differing 0\n", variant, rep.Requests))
}

// TestRunEngineModel: `cpcache run --engine model` on real rank processes (the model's
// attention merged over the shared-memory CP group of 4 processes, its KV in their L1
// buffers and shared-memory L2 slabs) prints differing 0 for the GQA default and the MLA
// variant, with prefixes served from L1 and L2; against a file store, a second run with
// fresh L1 and L2 serves prefixes from storage and still prints differing 0; a slice of the
// Mooncake conversation trace read at 1/8 of its lengths (--trace-scale 8) does too.
func TestRunEngineModel(t *testing.T) {
	t.Run("gqa", func(t *testing.T) {
		status, rep, out, errOut := runBinary(t, nil, modelRunArgs...)
		requireModelOracle(t, "gqa", status, rep, out, errOut)
		assert.Equal(t, int64(4), rep.Requests)
		assert.Positive(t, rep.TokensHitL1)
		assert.Positive(t, rep.TokensHitL2, "histories beyond L1 come back from L2")
		assert.Positive(t, rep.PagesLoadedL2)
	})
	t.Run("mla", func(t *testing.T) {
		status, rep, out, errOut := runBinary(t, nil, append([]string{"--model-variant", "mla"}, modelRunArgs...)...)
		requireModelOracle(t, "mla", status, rep, out, errOut)
		assert.Positive(t, rep.TokensHitL2, "histories beyond L1 come back from L2")
	})
	t.Run("L3 second run", func(t *testing.T) {
		args := append([]string{"--storage", "file://" + t.TempDir()}, modelRunArgs...)
		status, rep, out, errOut := runBinary(t, nil, args...)
		requireModelOracle(t, "gqa", status, rep, out, errOut)
		assert.Positive(t, rep.StoragePagesWritten, "the first run fills the store")
		status, rep, out, errOut = runBinary(t, nil, args...)
		requireModelOracle(t, "gqa", status, rep, out, errOut)
		assert.Positive(t, rep.TokensHitL3, "the second run serves prefixes from storage")
		assert.Positive(t, rep.StoragePagesRead)
	})
	t.Run("trace", func(t *testing.T) {
		trace := modelTrace(t, 8, 2048, 64)
		status, rep, out, errOut := runBinary(t, nil, append(modelRunArgs, "--workload", "trace", "--trace", trace, "--trace-scale", "8")...)
		requireModelOracle(t, "gqa", status, rep, out, errOut)
		assert.Equal(t, int64(8), rep.Requests)
		// The slice's requests share their first block (512/8 tokens) and nothing more: the
		// unlimited bound is that block for every request but the first, and the cache serves
		// exactly it, as does the LRU reference of the trace's 64-token blocks.
		block := int64(workload.BlockTokens / 8)
		require.Equal(t, (rep.Requests-1)*block, rep.Reference.ReuseBoundTokens, "the slice shares only its first block")
		assert.Equal(t, rep.Reference.ReuseBoundTokens, rep.TokensHitL1+rep.TokensHitL2, "the shared first block is served from the cache")
		assert.Equal(t, rep.Reference.ReuseBoundTokens, rep.Reference.LRUBlockTokens, "an LRU of 64-token blocks serves the shared block")
		assert.Contains(t, out, fmt.Sprintf(", LRU of 64-token blocks (%d tokens) ", rep.Reference.CapacityTokens))
	})
}

// modelTrace writes the first n requests of the Mooncake conversation trace with prompts of
// at most maxInput tokens, their answers cut to maxOutput tokens, or skips the test without
// the trace.
func modelTrace(t *testing.T, n, maxInput, maxOutput int) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "..", "shared", "data", "traces", "conversation_trace.jsonl"))
	if err != nil {
		t.Skipf("the conversation trace is not here: %v", err)
	}
	defer f.Close()
	var out []byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() && n > 0 {
		var r map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		if int(r["input_length"].(float64)) > maxInput {
			continue
		}
		r["output_length"] = min(int(r["output_length"].(float64)), maxOutput)
		line, err := json.Marshal(r)
		require.NoError(t, err)
		out = append(append(out, line...), '\n')
		n--
	}
	require.NoError(t, sc.Err())
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, out, 0o600))
	return path
}
