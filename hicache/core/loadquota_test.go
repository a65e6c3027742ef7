package core

import "testing"

// TestLoadBackSplitsANodeLongerThanTheQuota: a host hit whose node is longer than the load
// quota (a long prefetch from storage is one node) was never loaded back: LoadBack stopped
// before the node and loaded nothing, so the scheduler computed the whole hit. It loads the
// node's head now, as much as the quota allows, and the rest at the next calls.
func TestLoadBackSplitsANodeLongerThanTheQuota(t *testing.T) {
	const n, pages, quota = 2, 20, 8
	r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 32, LoadQuotaPages: quota}, 32, 1)
	tokens := make([]int32, pages*4)
	for i := range tokens {
		tokens[i] = int32(i + 1)
	}
	if _, err := r.insert(tokens); err != nil {
		t.Fatal(err)
	}
	settle := func() {
		t.Helper()
		for k := 0; r.cores[0].Pending() > 0; k++ {
			if k > 1000 {
				t.Fatal("copies never end")
			}
			if err := r.step(); err != nil {
				t.Fatal(err)
			}
		}
	}
	settle()
	r.each(func(_ int, c *Core) error { c.EvictL1(pages); return nil })
	if m := r.match(tokens)[0]; m.DevicePages != 0 || m.HostPages != pages {
		t.Fatalf("after the eviction: %d device and %d host pages, want 0 and %d", m.DevicePages, m.HostPages, pages)
	}
	for want := quota; ; want = min(want+quota, pages) {
		ms := r.match(tokens)
		if ms[0].HostPages == 0 {
			break
		}
		var loaded int
		if err := r.each(func(i int, c *Core) error {
			res, err := c.LoadBack(ms[i].Last)
			loaded = res.Pages
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if loaded != min(quota, ms[0].HostPages) {
			t.Fatalf("load-back of %d host pages loaded %d, want %d (the quota)", ms[0].HostPages, loaded, min(quota, ms[0].HostPages))
		}
		settle()
		if m := r.match(tokens)[0]; m.DevicePages != want {
			t.Fatalf("%d device pages after the load, want %d", m.DevicePages, want)
		}
	}
}
