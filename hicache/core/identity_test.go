package core

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// FuzzTreeIndexCollisions runs random inserts and matches under a few isolation keys on a
// tree whose index keeps only the low bits of the page ids' 64-bit index (indexMask 0 to 3
// bits), so that most first pages share an index bucket with others, against a naive model
// (the set of inserted prefixes per key). Every insert caches all its whole pages, every
// match finds exactly the longest inserted prefix under its key, and every node holds the
// ids of its own prefix: an index collision never makes one prefix another, nor a prefix
// uncacheable. A replica with the full index agrees on every result and digest.
func FuzzTreeIndexCollisions(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6, 7, 8} {
		f.Add(seed, uint8(seed%4))
	}
	f.Fuzz(func(t *testing.T, seed uint64, bits uint8) {
		const P = 4
		opts := Options{PageSize: P, L1Pages: 1 << 12}
		narrow := newTestCore(t, opts)
		narrow.indexMask = 1<<(bits%4) - 1 // 1, 2, 4 or 8 buckets
		full := newTestCore(t, opts)
		rng := rand.New(rand.NewPCG(seed, 99))
		keys := []string{"", "a", "b"}
		// A small alphabet and shared stems make prefixes share pages and diverge often.
		stems := make([][]int32, 4)
		for i := range stems {
			stems[i] = make([]int32, P*(1+rng.IntN(3)))
			for j := range stems[i] {
				stems[i][j] = rng.Int32N(3)
			}
		}
		seq := func() []int32 {
			s := slices.Clone(stems[rng.IntN(len(stems))])
			for range rng.IntN(4 * P) {
				s = append(s, rng.Int32N(3))
			}
			return s
		}
		model := map[string]map[string]bool{} // key -> inserted whole-page prefixes (as strings)
		prefix := func(s []int32, pages int) string { return string(slices.Clone(toBytes(s[:pages*P]))) }
		longest := func(key string, s []int32) int {
			n := 0
			for j := 1; j <= len(s)/P; j++ {
				if model[key][prefix(s, j)] {
					n = j
				}
			}
			return n
		}
		for op := range 300 {
			key, s := keys[rng.IntN(len(keys))], seq()
			np := len(s) / P
			if rng.IntN(3) == 0 {
				want := longest(key, s)
				m, mf := narrow.Match(Request{Tokens: s, Key: key}), full.Match(Request{Tokens: s, Key: key})
				if got := m.DevicePages + m.HostPages; got != want {
					t.Fatalf("op %d: match under key %q of %v: %d pages, the model holds %d", op, key, s, got, want)
				}
				if m.DevicePages != mf.DevicePages || m.HostPages != mf.HostPages {
					t.Fatalf("op %d: the narrow index matched %+v, the full one %+v", op, m, mf)
				}
				continue
			}
			r, err := narrow.Insert(Request{Tokens: s, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			rf, err := full.Insert(Request{Tokens: s, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			if r.Pages != np || rf.Pages != np {
				t.Fatalf("op %d: insert under key %q of %d pages cached %d (narrow index), %d (full)", op, key, np, r.Pages, rf.Pages)
			}
			if model[key] == nil {
				model[key] = map[string]bool{}
			}
			for j := 1; j <= np; j++ {
				model[key][prefix(s, j)] = true
			}
			if narrow.StateDigest() != full.StateDigest() {
				t.Fatalf("op %d: digests differ between the narrow and the full index", op)
			}
		}
		checkTreeIDs(t, narrow)
	})
}

// checkTreeIDs checks that every node's ids are those of its own prefix under its key, and
// that the index finds every node by the id of its first page.
func checkTreeIDs(t *testing.T, c *Core) {
	t.Helper()
	P := c.cfg.PageSize
	var visit func(n *treeNode, toks []int32)
	visit = func(n *treeNode, toks []int32) {
		for _, ch := range n.children {
			full := append(slices.Clone(toks), ch.tokens...)
			ids := KeyPrefixHashes(ch.key, full, P)
			if !slices.Equal(ch.hashes, ids[len(ids)-len(ch.hashes):]) {
				t.Fatalf("node %s under key %q holds ids that are not its prefix's", nodeName(ch), ch.key)
			}
			if c.indexGet(ch.hashes[0]) != ch {
				t.Fatalf("the index does not find node %s by its first page's id", nodeName(ch))
			}
			visit(ch, full)
		}
	}
	visit(c.root, nil)
}

func toBytes(s []int32) []byte {
	b := make([]byte, 0, 4*len(s))
	for _, t := range s {
		b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	return b
}
