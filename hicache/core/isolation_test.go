package core

import (
	"encoding/hex"
	"slices"
	"testing"
)

// goldenTokens and goldenHashes are the page ids of a fixed sequence under the empty key
// (hash.go; checked independently with Python's hashlib): every rank, run and release
// must compute them, or L3 pages written by another stop hitting.
var (
	goldenTokens = func() []int32 {
		t := make([]int32, 12)
		for i := range t {
			t[i] = int32(i*7 + 1)
		}
		return t
	}()
	goldenHashes = []PageID{
		mustID("3f76ab2a86abfb83f01e0646679bcc20b6e2fb843c84c34a19ea7d5d3048ff32"),
		mustID("4fefbd314780c2918ce306e546963b939b71b1264635f634de3f7fcbf7954d33"),
		mustID("ab55e1c2990cabc644283f1cdaf00e9e716ead17943fa36df1775017eadd42db"),
	}
)

func TestEmptyIsolationKeyKeepsHashes(t *testing.T) {
	if got := PrefixHashes(goldenTokens, 4); !slices.Equal(got, goldenHashes) {
		t.Fatalf("PrefixHashes %#x, want %#x", got, goldenHashes)
	}
	if got := KeyPrefixHashes("", goldenTokens, 4); !slices.Equal(got, goldenHashes) {
		t.Fatalf("KeyPrefixHashes of the empty key %#x, want %#x", got, goldenHashes)
	}
	if KeyRoot("") != RootID {
		t.Fatalf("KeyRoot(\"\") = %#x, want RootID %#x", KeyRoot(""), RootID)
	}
	c := newTestCore(t, Options{PageSize: 4, L1Pages: 16})
	res, err := c.Insert(Request{Tokens: goldenTokens})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.at(res.Last).hashes; !slices.Equal(got, goldenHashes) || c.at(res.Last).key != "" {
		t.Fatalf("inserted node hashes %#x key %q, want %#x and the empty key", got, c.at(res.Last).key, goldenHashes)
	}
	for _, key := range []string{"a", "b", "tenant-1", "\x00"} {
		h := KeyPrefixHashes(key, goldenTokens, 4)
		for i := range h {
			if h[i] == goldenHashes[i] {
				t.Fatalf("key %q: page %d hash %#x equals the empty key's", key, i, h[i])
			}
		}
	}
	if KeyPrefixHashes("a", goldenTokens, 4)[0] == KeyPrefixHashes("b", goldenTokens, 4)[0] {
		t.Fatal("keys a and b give the same first page hash")
	}
}

// TestIsolationKeySeparatesTree: equal tokens under two keys are two nodes that never
// match across keys, also when one key's sequence is a prefix of the other's.
func TestIsolationKeySeparatesTree(t *testing.T) {
	c := newTestCore(t, Options{PageSize: 4, L1Pages: 64})
	for _, key := range []string{"", "a"} {
		if _, err := c.Insert(Request{Tokens: goldenTokens, Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	if c.Nodes() != 2 {
		t.Fatalf("%d nodes for one sequence under two keys, want 2", c.Nodes())
	}
	for _, tc := range []struct {
		key  string
		want int
	}{{"", 3}, {"a", 3}, {"b", 0}} {
		m := c.Match(Request{Tokens: goldenTokens, Key: tc.key})
		if m.DevicePages != tc.want || m.HostPages != 0 {
			t.Fatalf("key %q: %d+%d pages matched, want %d+0", tc.key, m.DevicePages, m.HostPages, tc.want)
		}
		if tc.want > 0 && c.at(m.Last).key != tc.key {
			t.Fatalf("key %q matched a node of key %q", tc.key, c.at(m.Last).key)
		}
	}
	// A longer sequence under "a" extends a's node only (a split keeps the key).
	longer := append(slices.Clone(goldenTokens[:8]), 99, 98, 97, 96)
	res, err := c.Insert(Request{Tokens: longer, Key: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if c.at(res.Last).key != "a" || c.at(res.Last).parent.key != "a" {
		t.Fatalf("split under key a: keys %q and %q", c.at(res.Last).key, c.at(res.Last).parent.key)
	}
	if m := c.Match(Request{Tokens: longer}); m.DevicePages != 2 {
		t.Fatalf("the empty key matched %d pages of a's longer sequence, want its own 2", m.DevicePages)
	}
	if got := c.Peek(Request{Tokens: longer, Key: "b"}); got.Handle != 0 {
		t.Fatalf("Peek under key b found node %d", got.ID)
	}
	if err := c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

func mustID(s string) PageID {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != PageIDSize {
		panic("bad PageID literal " + s)
	}
	return PageID(b)
}
