package workload

// Request is one inference request: the prompt tokens and how many tokens to decode.
type Request struct {
	ID        int     // position in the workload, 0-based
	ArrivalMs int64   // arrival time in milliseconds from the start (trace timestamp)
	Tokens    []int32 // prompt token ids
	OutputLen int     // tokens to decode
	Client    int     // conversation (synthetic) or -1 (trace)
	Round     int     // turn within the conversation (synthetic), 0 for traces
}

// mix64 is SplitMix64's finaliser: a fixed, well-distributed 64-bit hash.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// VocabSize bounds generated token ids (a typical LLM vocabulary).
const VocabSize = 151_936

func token(parts ...uint64) int32 {
	h := uint64(0x5f3759df)
	for _, p := range parts {
		h = mix64(h ^ p)
	}
	return int32(h % VocabSize)
}
