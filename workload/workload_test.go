package workload

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSyntheticTurnsExtendTheirHistory(t *testing.T) {
	cfg := SyntheticConfig{Clients: 3, Rounds: 4, SystemTokens: 10, QuestionTokens: 5, AnswerTokens: 7, Seed: 9}
	reqs, err := Synthetic(cfg)
	require.NoError(t, err)
	require.Len(t, reqs, 12)
	byClient := map[int][]Request{}
	for i, r := range reqs {
		assert.Equal(t, i, r.ID)
		byClient[r.Client] = append(byClient[r.Client], r)
	}
	for cl, turns := range byClient {
		for r := 1; r < len(turns); r++ {
			prev, cur := turns[r-1], turns[r]
			history := append(slices.Clone(prev.Tokens), Answer(prev)...)
			require.True(t, slices.Equal(history, cur.Tokens[:len(history)]), "client %d turn %d does not extend its history", cl, r)
			assert.Len(t, cur.Tokens, len(history)+cfg.QuestionTokens)
		}
	}
	// The system prompt is shared, questions are not.
	assert.Equal(t, reqs[0].Tokens[:10], reqs[1].Tokens[:10])
	assert.NotEqual(t, reqs[0].Tokens[10:], reqs[1].Tokens[10:])
	again, _ := Synthetic(cfg)
	assert.Equal(t, reqs, again, "deterministic")
}

// TestSyntheticTurnGapSpreadsArrivals: with a turn gap each conversation asks every gap and
// the clients are staggered evenly over one gap, so the requests stay in arrival order in
// issue order; without one, round r arrives at r ms.
func TestSyntheticTurnGapSpreadsArrivals(t *testing.T) {
	cfg := SyntheticConfig{Clients: 4, Rounds: 3, QuestionTokens: 2, AnswerTokens: 1, TurnGapMs: 2000}
	reqs, err := Synthetic(cfg)
	require.NoError(t, err)
	var arrivals []int64
	for _, r := range reqs {
		arrivals = append(arrivals, r.ArrivalMs)
	}
	assert.Equal(t, []int64{0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500}, arrivals)
	cfg.TurnGapMs = 0
	reqs, err = Synthetic(cfg)
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, []int64{reqs[0].ArrivalMs, reqs[1].ArrivalMs, reqs[2].ArrivalMs, reqs[3].ArrivalMs,
		reqs[4].ArrivalMs, reqs[5].ArrivalMs, reqs[6].ArrivalMs, reqs[7].ArrivalMs, reqs[8].ArrivalMs, reqs[9].ArrivalMs, reqs[10].ArrivalMs, reqs[11].ArrivalMs})
}

func TestSyntheticRejectsBadConfig(t *testing.T) {
	_, err := Synthetic(SyntheticConfig{Clients: 1, Rounds: 1, QuestionTokens: 1, TurnGapMs: -5})
	assert.ErrorContains(t, err, "turn gap -5 ms")
	_, err = Synthetic(SyntheticConfig{Clients: 0, Rounds: 1, QuestionTokens: 1})
	assert.ErrorContains(t, err, "clients 0")
	_, err = Synthetic(SyntheticConfig{Clients: 1, Rounds: 1, QuestionTokens: 0})
	assert.ErrorContains(t, err, "question tokens 0")
}

func TestTraceEqualBlockIDsGiveEqualPrefixes(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 5, "input_length": 700, "output_length": 4, "hash_ids": [0, 7]}

{"timestamp": 9, "input_length": 1, "output_length": 0, "hash_ids": [3], "extra": true}
`
	reqs, err := ReadTrace(strings.NewReader(in), TraceOptions{})
	require.NoError(t, err)
	require.Len(t, reqs, 3)
	assert.Len(t, reqs[0].Tokens, 1100)
	assert.Equal(t, reqs[0].Tokens[:512], reqs[1].Tokens[:512])
	assert.NotEqual(t, reqs[0].Tokens[512:700], reqs[1].Tokens[512:700])
	assert.Equal(t, int64(5), reqs[1].ArrivalMs)
	assert.Equal(t, 4, reqs[1].OutputLen)
	cut, err := ReadTrace(strings.NewReader(in), TraceOptions{MaxRequests: 2})
	require.NoError(t, err)
	assert.Len(t, cut, 2)
}

// TestTraceScale: a trace read at scale 8 holds every request at 1/8 of its lengths (rounded
// up), each hash id behind 64 tokens: requests share the scaled blocks their hash ids share
// and no more, as they do at scale 1. A scale that is not a power of two up to 512 is refused
// naming it.
func TestTraceScale(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 5, "input_length": 700, "output_length": 0, "hash_ids": [0, 7]}
{"timestamp": 9, "input_length": 1, "output_length": 17, "hash_ids": [3]}
`
	reqs, err := ReadTrace(strings.NewReader(in), TraceOptions{Scale: 8})
	require.NoError(t, err)
	require.Len(t, reqs, 3)
	assert.Len(t, reqs[0].Tokens, 138) // 1100/8 rounded up
	assert.Len(t, reqs[1].Tokens, 88)
	assert.Len(t, reqs[2].Tokens, 1)
	assert.Equal(t, []int{1, 0, 3}, []int{reqs[0].OutputLen, reqs[1].OutputLen, reqs[2].OutputLen})
	assert.Equal(t, reqs[0].Tokens[:64], reqs[1].Tokens[:64], "hash id 0 is the same 64 tokens")
	assert.NotEqual(t, reqs[0].Tokens[64], reqs[1].Tokens[64], "hash ids 1 and 7 differ from their first token")
	full, err := ReadTrace(strings.NewReader(in), TraceOptions{Scale: 1})
	require.NoError(t, err)
	assert.Equal(t, full[0].Tokens[:64], reqs[0].Tokens[:64], "a scaled block is the first tokens of its block as written")
	assert.Len(t, full[0].Tokens, 1100)
	for _, bad := range []int{3, 1024, -2} {
		_, err := ReadTrace(strings.NewReader(in), TraceOptions{Scale: bad})
		require.ErrorIs(t, err, ErrBadScale, "scale %d", bad)
		assert.Contains(t, err.Error(), fmt.Sprintf("%d is not a power of two from 1 to 512", bad))
	}
}

func TestTraceCorruptLineIsNamed(t *testing.T) {
	cases := map[string]string{
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}` + "\n{oops\n": "line 2: invalid JSON",
		`{"timestamp": 0, "output_length": 1, "hash_ids": [0]}`:                                   `line 1: missing "input_length"`,
		`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}`:              "line 1: input_length 600 exceeds 1 hash_ids",
		`{"timestamp": 0, "input_length": 6, "output_length": -1, "hash_ids": [0]}`:               "line 1: output_length -1 is negative",
		`{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": []}`:                 `line 1: missing or empty "hash_ids"`,
		"": "no requests",
		`{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [0]}` + "\n" + `[1,2]`:                                                                     "line 2: invalid JSON",
		`{"timestamp": "x", "input_length": 6, "output_length": 1, "hash_ids": [0]}`:                                                                                    "line 1: invalid JSON",
		`{"timestamp": 1, "input_length": 6, "output_length": 1, "hash_ids": [0]}` + "\n" + `{"timestamp": -1, "input_length": 6, "output_length": 1, "hash_ids": [0]}`: "line 2: timestamp -1 is negative",
	}
	for in, want := range cases {
		_, err := ReadTrace(strings.NewReader(in), TraceOptions{})
		require.Error(t, err, in)
		assert.ErrorIs(t, err, ErrBadTrace)
		assert.Contains(t, err.Error(), want)
	}
	_, err := ReadTraceFile(filepath.Join(t.TempDir(), "missing.jsonl"), TraceOptions{})
	assert.ErrorContains(t, err, "missing.jsonl")
}

func TestPublicTracesParse(t *testing.T) {
	path := filepath.Join("..", "..", "shared", "data", "traces", "synthetic_trace.jsonl")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("public trace not available at %s: %v", path, err)
	}
	reqs, err := ReadTraceFile(path, TraceOptions{MaxRequests: 300})
	require.NoError(t, err)
	assert.Len(t, reqs, 300)
}

// TestReferencesOfBadSizes: a page size or capacity that is not positive serves nothing;
// ReuseBound must not panic (a division by the page size).
func TestReferencesOfBadSizes(t *testing.T) {
	reqs, err := Synthetic(SyntheticConfig{Clients: 2, Rounds: 2, QuestionTokens: 64, AnswerTokens: 8})
	require.NoError(t, err)
	for _, size := range []int{0, -16} {
		assert.Zero(t, ReuseBound(reqs, size), "page size %d", size)
		assert.Zero(t, LRUBlockHits(reqs, BlockTokens, size), "capacity %d", size)
		assert.Zero(t, LRUBlockHits(reqs, size, 64), "block size %d", size)
	}
	assert.Positive(t, ReuseBound(reqs, 16))
}

// TestLRUBlockHitsAtTraceScale: three requests of a trace sharing only their first hash id,
// read at 1/8 (blocks of 64 tokens): an LRU of 64-token blocks serves the shared block to the
// second and third (2 × 64 tokens) unless its capacity is one block, while one of 512-token
// blocks, longer than the shared prefix, serves nothing.
func TestLRUBlockHitsAtTraceScale(t *testing.T) {
	const trace = `{"timestamp": 0, "input_length": 1024, "output_length": 64, "hash_ids": [0, 1]}
{"timestamp": 1, "input_length": 1024, "output_length": 64, "hash_ids": [0, 2]}
{"timestamp": 2, "input_length": 1536, "output_length": 64, "hash_ids": [0, 3, 4]}
`
	reqs, err := ReadTrace(strings.NewReader(trace), TraceOptions{Scale: 8})
	require.NoError(t, err)
	require.Len(t, reqs, 3)
	block := BlockTokens / 8
	assert.Equal(t, int64((len(reqs)-1)*block), LRUBlockHits(reqs, block, 1000), "the shared first block, for every request after the first")
	assert.Zero(t, LRUBlockHits(reqs, BlockTokens, 1000), "no 512-token prefix is shared")
	assert.Zero(t, LRUBlockHits(reqs, block, 1), "one block: each request's last block pushes the shared one out")
}

// TestShippedTraceSlice: testdata's slice of Mooncake's conversation trace (testdata/README.md)
// parses whole: 400 requests, arrivals from 0 to 141 s, and requests that share blocks share
// prompt tokens.
func TestShippedTraceSlice(t *testing.T) {
	reqs, err := ReadTraceFile(filepath.Join("..", "testdata", "conversation_trace_400.jsonl"), TraceOptions{})
	require.NoError(t, err)
	require.Len(t, reqs, 400)
	assert.Equal(t, int64(0), reqs[0].ArrivalMs)
	assert.Equal(t, int64(141000), reqs[399].ArrivalMs)
	assert.Equal(t, 6758, len(reqs[0].Tokens))
	assert.Equal(t, reqs[0].Tokens[:512], reqs[1].Tokens[:512], "both start with block 0")
}
