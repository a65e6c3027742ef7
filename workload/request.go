package workload

import "github.com/cpcache/cpcache/internal/mix"

// Request is one inference request: the prompt tokens and how many tokens to decode.
type Request struct {
	ID        int     // position in the workload, 0-based
	ArrivalMs int64   // arrival time in milliseconds from the start (trace timestamp)
	Tokens    []int32 // prompt token ids
	OutputLen int     // tokens to decode
	Client    int     // conversation (synthetic) or -1 (trace)
	Round     int     // turn within the conversation (synthetic), 0 for traces
	Tenant    string  // trace: the line's optional "tenant" field ("": none); synthetic: ""
	// Key is the isolation key the cache keeps the request's pages under ("": the shared
	// key space). The workload leaves it empty; a server assigns it (cpcache run --isolation).
	Key string
}

// mix64 is one SplitMix64 step: the golden-ratio increment, then the finaliser; a fixed,
// well-distributed 64-bit hash.
func mix64(x uint64) uint64 { return mix.Mix64(x + 0x9e3779b97f4a7c15) }

// VocabSize bounds generated token ids (a typical LLM vocabulary).
const VocabSize = 151_936

func token(parts ...uint64) int32 {
	h := uint64(0x5f3759df)
	for _, p := range parts {
		h = mix64(h ^ p)
	}
	return int32(h % VocabSize)
}
