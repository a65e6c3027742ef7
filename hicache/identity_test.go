package hicache

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/mix"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// The page hash cpcache used before page ids were 256-bit (64-bit FNV-1a chained over the
// tokens, finalized by a mixer), copied here to forge a collision with it: the tests below
// show that a page forged this way gets none of another tenant's pages with the page ids.
const (
	oldRootHash  = 0x243f6a8885a308d3
	oldFNVOffset = 0xcbf29ce484222325
	oldFNVPrime  = 0x100000001b3
)

func oldKeyRoot(key string) uint64 {
	if key == "" {
		return oldRootHash
	}
	x := uint64(oldFNVOffset)
	for i := 0; i < len(key); i++ {
		x = (x ^ uint64(key[i])) * oldFNVPrime
	}
	r := mix.Mix64(x^uint64(len(key))<<56) ^ oldRootHash
	if r == oldRootHash {
		r = ^r
	}
	return r
}

// oldState is the FNV state of the old page hash after tokens, before the mixer (a
// bijection: equal states are equal hashes).
func oldState(prev uint64, tokens []int32) uint64 {
	x := prev ^ oldFNVOffset
	for _, t := range tokens {
		x = (x ^ uint64(uint32(t))) * oldFNVPrime
	}
	return x
}

func oldPageHash(prev uint64, page []int32) uint64 { return mix.Mix64(oldState(prev, page)) }

// forgePage returns a page of 4 tokens whose old hash under isolation key keyB equals the
// old hash of page under keyA, the way an attacker would: two random tokens, then the last
// two solved for. The state before the last token must have the high 32 bits of
// y = target·prime⁻¹ (the last token xors the low 32 only). With z = H·2³² + L the state
// before the third multiplication (H fixed, L free through the third token) and prime =
// 2⁴⁰ + 435, the high 32 bits of z·prime are ((L mod 2²⁴)·2⁸ + H·435 + ⌊L·435/2³²⁾) mod 2³²:
// solve for the low 24 bits of L per value of the last term (< 435), try the 256 top bytes.
func forgePage(t *testing.T, keyA string, page []int32, keyB string) []int32 {
	t.Helper()
	target := oldState(oldKeyRoot(keyA), page)
	inv := uint64(1) // prime⁻¹ mod 2⁶⁴ by Newton's iteration
	for range 6 {
		inv *= 2 - oldFNVPrime*inv
	}
	y := target * inv
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		forged := []int32{rng.Int32(), rng.Int32(), 0, 0}
		x2 := oldState(oldKeyRoot(keyB), forged[:2])
		H := x2 >> 32
		T := uint32(y>>32) - uint32(H*435)
		for c := T & 255; c < 435; c += 256 {
			low := ((T - c) >> 8) & 0xffffff
			for h := range uint32(256) {
				L := h<<24 | low
				if uint32((uint64(L)*435)>>32) != c {
					continue
				}
				x3 := (H<<32 | uint64(L)) * oldFNVPrime
				if x3>>32 != y>>32 {
					continue
				}
				forged[2] = int32(L ^ uint32(x2))
				forged[3] = int32(uint32(x3) ^ uint32(y))
				if oldPageHash(oldKeyRoot(keyB), forged) != oldPageHash(oldKeyRoot(keyA), page) {
					t.Fatalf("forged page %v does not collide", forged)
				}
				return forged
			}
		}
	}
	t.Fatal("no collision found")
	return nil
}

// TestForgedCollisionServesNoOtherTenant: tenant B inserts a page crafted so that its old
// 64-bit hash under B's isolation key equals that of tenant A's first page under A's key
// (the old L3 key derived from that hash, so A's prefetch loaded B's bytes, and in the tree
// the collision left A's prompt uncacheable). With the page ids: A's prefetch finds none of
// B's pages in storage (the storage reports no hit), A's prompt is inserted whole beside
// B's, and both read back their own bytes.
func TestForgedCollisionServesNoOtherTenant(t *testing.T) {
	ns := testNamespace(t)
	l3 := L3Options{PrefetchPolicy: PrefetchWaitComplete, MinPrefetchPages: 1, PrefetchQuotaPages: 64, ReadChunkPages: 4,
		PrefetchTimeoutBase: time.Second}
	r := newRig(t, l3RigConfig(parallel.LayoutConfig{World: 4, TP: 4, AttnCP: 4}, openStores(t, "mem://"+t.Name(), ns), ns, l3))
	rng := rand.New(rand.NewPCG(37, 1))
	random := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = rng.Int32N(32000)
		}
		return s
	}
	promptA := random(16)
	forged := forgePage(t, "tenant-a", promptA[:4], "tenant-b")
	promptB := append(forged, random(12)...)
	if oldPageHash(oldKeyRoot("tenant-b"), promptB[:4]) != oldPageHash(oldKeyRoot("tenant-a"), promptA[:4]) {
		t.Fatal("the forged page does not collide under the old hash")
	}
	if KeyPrefixHashes("tenant-b", promptB, 4)[0] == KeyPrefixHashes("tenant-a", promptA, 4)[0] {
		t.Fatal("the forged page has tenant A's page id")
	}

	// B's prompt is cached and backed up to storage, then dropped from L1 and L2.
	r.key = "tenant-b"
	r.insertAll([][]int32{promptB})
	if st := r.sameStats(); st.L3BackedUpPages != 4 {
		t.Fatalf("%d pages backed up, want tenant B's 4", st.L3BackedUpPages)
	}
	r.evictAll()
	storageHits := func() (n uint64) {
		for _, c := range r.caches {
			n += c.l3.st.Stats().Hits
		}
		return n
	}
	hits := storageHits()

	// A's prefetch: nothing of A is stored, so nothing is found and nothing is read.
	r.key = "tenant-a"
	if n := r.storedPages(promptA); n != 0 {
		t.Fatalf("storage holds %d leading pages of tenant A's prompt", n)
	}
	pf := r.prefetch(promptA, -1)
	if out, _ := r.caches[0].PrefetchOutcome(pf.ID); pf.ID != 0 && (out.Stored != 0 || out.Inserted != 0) {
		t.Fatalf("tenant A's prefetch found tenant B's page: %+v", out)
	}
	if d := storageHits() - hits; d != 0 {
		t.Fatalf("tenant A's prefetch read %d values from storage", d)
	}
	ms, err := r.matchLoad(promptA, false)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].DevicePages+ms[0].HostPages != 0 {
		t.Fatalf("tenant A matched %d device + %d host pages before inserting anything", ms[0].DevicePages, ms[0].HostPages)
	}

	// B's prompt back in the tree (from storage), then A's: all of A's pages are inserted
	// beside B's colliding one, and each tenant reads its own bytes (matchLoad verifies the
	// content of every page against its own page id).
	r.key = "tenant-b"
	r.prefetch(promptB, -1)
	if ms, err := r.matchLoad(promptB, true); err != nil || ms[0].DevicePages != 4 {
		t.Fatalf("tenant B: %+v, %v; want its 4 pages", ms[0], err)
	}
	r.key = "tenant-a"
	res, err := r.insert(promptA)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Pages != 4 {
		t.Fatalf("tenant A's prompt: %d of 4 pages inserted", res[0].Pages)
	}
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	r.drain()
	for _, key := range []string{"tenant-a", "tenant-b"} {
		r.key = key
		prompt := map[string][]int32{"tenant-a": promptA, "tenant-b": promptB}[key]
		ms, err := r.matchLoad(prompt, true)
		if err != nil {
			t.Fatal(err)
		}
		if ms[0].DevicePages != 4 {
			t.Fatalf("%s matched %d device + %d host pages, want 4 device", key, ms[0].DevicePages, ms[0].HostPages)
		}
	}
}

// TestL3PrefetchRefusesUnboundValue: a genuine value (right MAC, right key) bound to other
// tokens or another parent than the prefetch asked for is a miss, counted in the storage's
// Stats.Mismatched, never inserted: with page 0's value rewritten bound to other tokens the
// prefetch inserts nothing; with page 0 right and page 2's value bound under another parent,
// pages 0 and 1 only.
func TestL3PrefetchRefusesUnboundValue(t *testing.T) {
	ns := testNamespace(t)
	l3 := L3Options{PrefetchPolicy: PrefetchWaitComplete, MinPrefetchPages: 1, PrefetchQuotaPages: 64, ReadChunkPages: 4,
		PrefetchTimeoutBase: time.Second}
	r := newRig(t, l3RigConfig(parallel.LayoutConfig{World: 4, TP: 4, AttnCP: 4}, openStores(t, "mem://"+t.Name(), ns), ns, l3))
	rng := rand.New(rand.NewPCG(38, 1))
	prompt := make([]int32, 16)
	for i := range prompt {
		prompt[i] = rng.Int32N(32000)
	}
	r.key = "tenant"
	r.insertAll([][]int32{prompt})
	r.evictAll()
	ids := KeyPrefixHashes(r.key, prompt, 4)
	ctx := context.Background()
	// rebind rewrites page j's value on every shard, bound by bind(the right binding).
	saved := map[[2]int][]byte{} // (rank, page) -> the page's bytes as stored
	for i, c := range r.caches {
		for j := range ids {
			buf := [][]byte{make([]byte, 256)}
			if n, err := c.l3.st.Get(ctx, []storage.Key{c.l3.key(ids[j])}, buf, nil); err != nil || n != 1 {
				t.Fatalf("rank %d page %d: get %d, %v", i, j, n, err)
			}
			saved[[2]int{i, j}] = buf[0]
		}
	}
	rebind := func(j int, bind func(*storage.Binding)) {
		t.Helper()
		for i, c := range r.caches {
			k := c.l3.key(ids[j])
			buf := [][]byte{saved[[2]int{i, j}]}
			b := storage.Binding{Tokens: TokenDigest(prompt[4*j : 4*j+4]), Parent: KeyRoot(r.key)}
			if j > 0 {
				b.Parent = ids[j-1]
			}
			bind(&b)
			if err := c.l3.st.PutBound(ctx, []storage.Key{k}, []storage.Binding{b}, buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	mismatched := func() (n uint64) {
		for _, c := range r.caches {
			n += c.l3.st.Stats().Mismatched
		}
		return n
	}
	prefetched := func() PrefetchOutcome {
		t.Helper()
		pf := r.prefetch(prompt, -1)
		out, _ := r.caches[0].PrefetchOutcome(pf.ID)
		r.evictAll()
		return out
	}
	rebind(0, func(b *storage.Binding) { b.Tokens[0] ^= 1 })
	before := mismatched()
	if out := prefetched(); out.Inserted != 0 {
		t.Fatalf("page 0 bound to other tokens: prefetch %+v, want nothing inserted", out)
	}
	if d := mismatched() - before; d != 1 {
		t.Fatalf("Mismatched +%d, want 1 (page 0's owner)", d)
	}
	rebind(0, func(*storage.Binding) {}) // the refused value was deleted: put back, rightly bound
	rebind(2, func(b *storage.Binding) { b.Parent[31] ^= 1 })
	before = mismatched()
	if out := prefetched(); out.Inserted != 2 {
		t.Fatalf("page 2 bound under another parent: prefetch %+v, want pages 0 and 1 inserted", out)
	}
	if d := mismatched() - before; d != 1 {
		t.Fatalf("Mismatched +%d, want 1 (page 2's owner)", d)
	}
}
