package kvtest

import "math/rand/v2"

// RandomSequences returns n token sequences that share prefixes the way multi-turn traffic
// does: each one (after the first) continues a random cut of an earlier one with probability
// 2/3, then adds 1–6 pages and a partial page of tokens from a small vocabulary. A pure
// function of rng's state, so replicas given the same seed see the same sequences.
func RandomSequences(rng *rand.Rand, n, pageSize int) [][]int32 {
	var out [][]int32
	for i := 0; i < n; i++ {
		var s []int32
		if i > 0 && rng.IntN(3) > 0 {
			base := out[rng.IntN(len(out))]
			cut := rng.IntN(len(base) + 1)
			s = append(s, base[:cut]...)
		}
		extra := (1 + rng.IntN(6)) * pageSize
		for j := 0; j < extra+rng.IntN(pageSize); j++ {
			s = append(s, rng.Int32N(50))
		}
		out = append(out, s)
	}
	return out
}
