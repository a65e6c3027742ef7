package hicache

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
)

// TestIsolationKeySharesNoPage runs four in-process CP ranks with L3 storage: a second
// isolation key gets 0 hits on the first key's prompts in L1, in L2 and in storage, while the
// first key's repeats hit in every tier and the second key's own repeat hits; every step's
// digests are equal on every rank (rig.step checks them).
func TestIsolationKeySharesNoPage(t *testing.T) {
	ns := testNamespace(t)
	l3 := L3Options{PrefetchPolicy: PrefetchWaitComplete, MinPrefetchPages: 1, PrefetchQuotaPages: 64, ReadChunkPages: 4,
		PrefetchTimeoutBase: time.Second}
	r := newRig(t, l3RigConfig(parallel.LayoutConfig{World: 4, TP: 4, AttnCP: 4}, openStores(t, "mem://"+t.Name(), ns), ns, l3))
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(25, 4)), 5, 4)
	total := 0
	for _, s := range seqs {
		total += len(s) / 4
	}
	hits := func(key string) (device, host int) {
		t.Helper()
		r.key = key
		for _, s := range seqs {
			ms, err := r.matchLoad(s, false)
			if err != nil {
				t.Fatal(err)
			}
			device += ms[0].DevicePages
			host += ms[0].HostPages
		}
		return device, host
	}
	want := func(tier, key string, device, host, wantDevice, wantHost int) {
		t.Helper()
		if device != wantDevice || host != wantHost {
			t.Fatalf("%s: key %q matched %d device + %d host pages of %d, want %d + %d", tier, key, device, host, total, wantDevice, wantHost)
		}
	}

	r.key = "tenant-a"
	r.insertAll(seqs)
	if st := r.sameStats(); st.L3BackedUpPages == 0 {
		t.Fatal("nothing was backed up to storage")
	}
	for _, key := range []string{"tenant-b", ""} {
		d, h := hits(key)
		want("L1", key, d, h, 0, 0)
	}
	d, h := hits("tenant-a")
	want("L1", "tenant-a", d, h, total, 0)

	if err := r.each("evict L1", func(_ int, c *Cache) error { _, _, err := c.EvictL1(1 << 30); return err }); err != nil {
		t.Fatal(err)
	}
	r.drain()
	d, h = hits("tenant-b")
	want("L2", "tenant-b", d, h, 0, 0)
	d, h = hits("tenant-a")
	want("L2", "tenant-a", d, h, 0, total)

	r.evictAll()
	r.key = "tenant-b"
	for i, s := range seqs {
		if n := r.storedPages(s); n != 0 {
			t.Fatalf("storage holds %d pages of seq %d under tenant-b", n, i)
		}
		pf := r.prefetch(s, -1)
		if out, _ := r.caches[0].PrefetchOutcome(pf.ID); pf.ID != 0 && (out.Stored != 0 || out.Inserted != 0) {
			t.Fatalf("tenant-b's prefetch of seq %d: %+v", i, out)
		}
	}
	d, h = hits("tenant-b")
	want("L3", "tenant-b", d, h, 0, 0)
	r.key = "tenant-a"
	for _, s := range seqs {
		r.prefetch(s, -1)
	}
	d, h = hits("tenant-a")
	want("L3", "tenant-a", d, h, 0, total)

	r.key = "tenant-b"
	r.insertAll(seqs)
	d, h = hits("tenant-b")
	want("own repeat", "tenant-b", d, h, total, 0)
	d, h = hits("tenant-a")
	want("after tenant-b's insert", "tenant-a", d, h, 0, total)
}
