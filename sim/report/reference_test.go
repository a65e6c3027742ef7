package report

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/workload"
)

// referenceTrace: three requests sharing only their first hash id.
const referenceTrace = `{"timestamp": 0, "input_length": 1024, "output_length": 64, "hash_ids": [0, 1]}
{"timestamp": 1, "input_length": 1024, "output_length": 64, "hash_ids": [0, 2]}
{"timestamp": 2, "input_length": 1536, "output_length": 64, "hash_ids": [0, 3, 4]}
`

// TestReferenceAtTraceScale: for a trace read at 1/8 the LRU reference runs over the trace's
// own 64-token blocks, with the capacity counted in them: the requests after the first hit
// the shared block (an LRU of 512-token blocks would hit nothing), and the text and JSON
// reports say 64-token blocks. Unscaled, the text says 512-token blocks and the JSON has no
// block size, as before the size was recorded.
func TestReferenceAtTraceScale(t *testing.T) {
	reference := func(scale int, capacityTokens int64) Reference {
		reqs, err := workload.ReadTrace(strings.NewReader(referenceTrace), workload.TraceOptions{Scale: scale})
		require.NoError(t, err)
		return ReferenceOf([][]workload.Request{reqs}, 16, workload.BlockTokens/scale, capacityTokens)
	}
	texts := func(ref Reference) (string, string) {
		r := &Report{Reference: ref}
		var text strings.Builder
		r.writeTimeText(&text)
		js, err := json.Marshal(ref)
		require.NoError(t, err)
		return text.String(), string(js)
	}

	scaled := reference(8, 4096)
	assert.Equal(t, int64(2*64), scaled.LRUBlockTokens, "the shared 64-token block, for the second and third request")
	assert.Equal(t, scaled.ReuseBoundTokens, scaled.LRUBlockTokens, "nothing but the first block is shared")
	assert.Equal(t, 64, scaled.BlockSize())
	text, js := texts(scaled)
	assert.Contains(t, text, "LRU of 64-token blocks (4096 tokens)")
	assert.Contains(t, js, `"lru_block_size":64`)
	assert.Zero(t, reference(8, 64).LRUBlockTokens, "a capacity of 64 tokens is one block of 64")

	unscaled := reference(1, 4096*8)
	assert.Equal(t, int64(2*512), unscaled.LRUBlockTokens)
	assert.Equal(t, workload.BlockTokens, unscaled.BlockSize())
	text, js = texts(unscaled)
	assert.Contains(t, text, "LRU of 512-token blocks (32768 tokens)")
	assert.NotContains(t, js, "lru_block_size")
}
