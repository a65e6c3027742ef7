package alloc

import "testing"

// TestDigestIsAFixedFunctionOfState pins digest values: ranks running different builds (or a
// hash with a per-process seed) would disagree on equal states, so any change to the digest
// function must be deliberate and show up here.
func TestDigestIsAFixedFunctionOfState(t *testing.T) {
	a := mustAlloc(t, 4, 16)
	got := []uint64{a.Digest()}
	mustReserve(t, a, 7, 1, 6)
	got = append(got, a.Digest())
	must(t, a.Commit(7))
	got = append(got, a.Digest())
	want := []uint64{0xf791f8c3ca53f34c, 0xf5c27a25c46cd47d, 0x1793a670925d7996}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("digest %d = %#x, want %#x (the digest function changed)", i, got[i], want[i])
		}
	}
}
