package core

import "testing"

// TestPrefetchCostPays: the cost rule compares a read (latency + one I/O rank's pages at its
// bandwidth) with the prefill of the same tokens (linear + attention), and pages spread over
// the I/O ranks read in the time of one rank's share.
func TestPrefetchCostPays(t *testing.T) {
	// 1 µs per token, 4-token pages of 4096 bytes: 8 pages compute in 32 µs.
	pc := PrefetchCost{ComputeNsPerToken: 1000, PageBytes: 4096, IORanks: 1}
	// One rank reads 8 pages (32 KiB) at 1 byte/ns in 32.768 µs: slower than computing them.
	if pc.Pays(0, 8, 4, 1) {
		t.Fatal("8 pages read in 32.8 µs against 32 µs of compute: not worth it")
	}
	pc.IORanks = 8 // each of 8 ranks reads one page: 4.1 µs
	if !pc.Pays(0, 8, 4, 1) {
		t.Fatal("8 I/O ranks read 8 pages in 4.1 µs against 32 µs of compute")
	}
	pc.StorageLatencyNs = 30000 // 34.1 µs with the latency
	if pc.Pays(0, 8, 4, 1) {
		t.Fatal("a 30 µs latency makes the read slower than the prefill")
	}
	// Attention: tokens 1000..1032 attend to ~1000 tokens each, at 1 ns per pair: 32 µs more.
	pc.AttentionNsPerTokenPair = 1
	if pc.Pays(0, 8, 4, 1) == pc.Pays(250, 8, 4, 1) {
		t.Fatal("the same pages deeper in a prompt cost more to compute: the read pays off there")
	}
	if !(&PrefetchCost{}).Pays(0, 8, 4, 1e-9) || !pc.Pays(0, 8, 4, 0) {
		t.Fatal("no rule, or no known bandwidth: every stored continuation is read")
	}
}

// TestPrefetchCostMeasuredAgreed: with MeasuredReads, the ranks of a group that measured
// different read bandwidths agree on the slowest one through the vector and make the same
// decision from it, which the faster ones would not make from their own measurement alone
// (rank 0 measured a bandwidth at which the read pays off); every rank does the storage
// jobs of the pages it owns.
func TestPrefetchCostMeasuredAgreed(t *testing.T) {
	const n = 4
	// 1 µs per token, 4-token pages of 4096 bytes on their owner, 4 I/O ranks: 4 pages
	// compute in 16 µs and read in 4096 B / bandwidth; break-even 0.256 bytes/ns.
	cost := PrefetchCost{ComputeNsPerToken: 1000, PageBytes: 4096, MeasuredReads: true}
	cores := make([]*Core, n)
	for i := range cores {
		c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 32}, Slabs: n, PagesPerSlab: 32, CPRank: i, L3: true,
			L3Config: L3Config{Cost: cost}})
		if err != nil {
			t.Fatal(err)
		}
		cores[i] = c
	}
	r := &coreRig{cores: cores}
	// Every rank records its own measured bandwidth and finishes the storage jobs of the
	// pages it owns: each of them stored and read.
	step := func(rates []int64) {
		t.Helper()
		for i, c := range cores {
			c.StorageReadRate(rates[i])
		}
		r.finishStorageJobs(t)
	}
	seq := fourPages
	prefetch := func(rates []int64, base int32) PrefetchOutcome {
		t.Helper()
		var id uint64
		for i, c := range cores {
			res := c.Prefetch(Request{Tokens: seq(base)})
			if i == 0 {
				id = res.ID
			} else if res.ID != id || id == 0 {
				t.Fatalf("rank %d: prefetch %d, rank 0 %d", i, res.ID, id)
			}
		}
		step(rates) // the queries are answered
		if o, ok := cores[0].PrefetchOutcome(id); ok {
			return o
		}
		step(rates) // the reads are done
		o, ok := cores[0].PrefetchOutcome(id)
		if !ok {
			t.Fatalf("prefetch %d still pending", id)
		}
		return o
	}
	same := func(what string, wantRate int64) {
		t.Helper()
		d := cores[0].StateDigest()
		for i, c := range cores {
			if got := c.StorageReadRateAgreed(); got != wantRate {
				t.Fatalf("%s: rank %d agreed %d bytes/s, want %d", what, i, got, wantRate)
			}
			if c.StateDigest() != d {
				t.Fatalf("%s: rank %d state digest %#x, rank 0 %#x", what, i, c.StateDigest(), d)
			}
			if c.Stats() != cores[0].Stats() {
				t.Fatalf("%s: rank %d stats %+v, rank 0 %+v", what, i, c.Stats(), cores[0].Stats())
			}
		}
	}
	// Nothing measured yet: the bandwidth is unknown and the read goes ahead (it measures).
	if o := prefetch([]int64{0, 0, 0, 0}, 100); o != (PrefetchOutcome{Stored: 4, Inserted: 4}) {
		t.Fatalf("before any measurement: %+v, want every stored page read", o)
	}
	same("unmeasured", 0)
	// Rank 0 measured 1 GB/s (a read pays off: 4.1 µs), rank 1 0.2 GB/s (20.5 µs: it does
	// not); the group agrees on rank 1's.
	slow := []int64{1e9, 2e8, 5e9, 0}
	if pc := &cores[0].cfg.L3Config.Cost; !pc.Pays(0, 4, 4, 1) || pc.Pays(0, 4, 4, 0.2) {
		t.Fatal("at rank 0's own 1 GB/s the read pays off, at 0.2 GB/s it does not")
	}
	if o := prefetch(slow, 200); o != (PrefetchOutcome{Stored: 4, Refused: RefusedCost}) {
		t.Fatalf("slowest rank at 0.2 GB/s: %+v, want the 4 stored pages skipped for cost", o)
	}
	same("slow rank", 2e8)
	if got := cores[0].Stats().L3CostSkippedPages; got != 4 {
		t.Fatalf("skipped for cost: %d pages, want 4", got)
	}
	// The slow rank speeds up to 2 GB/s: the slowest is now rank 0 at 1 GB/s, and reads pay.
	fast := []int64{1e9, 2e9, 5e9, 0}
	if o := prefetch(fast, 300); o != (PrefetchOutcome{Stored: 4, Inserted: 4}) {
		t.Fatalf("slowest rank at 1 GB/s: %+v, want every stored page read", o)
	}
	same("fast ranks", 1e9)
	// A rank that stops measuring (0) keeps the agreed value where it was.
	step([]int64{0, 0, 0, 0})
	same("no new measurement", 1e9)
}

// TestPrefetchCostProbes: with MeasuredReads, one in probeEvery prefetches the rule would
// skip is read anyway, so that a store that got faster is measured again; every rank probes
// the same one.
func TestPrefetchCostProbes(t *testing.T) {
	c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 8}, Slabs: 1, PagesPerSlab: 8, L3: true,
		L3Config: L3Config{Cost: PrefetchCost{ComputeNsPerToken: 1000, PageBytes: 4096, MeasuredReads: true}}})
	if err != nil {
		t.Fatal(err)
	}
	c.l3.readRate = 1e6 // 1 MB/s: a 4 KiB page reads in 4 ms against 4 µs of compute
	read := 0
	for range 2 * probeEvery {
		if c.prefetchPays(0, 1) {
			read++
		}
	}
	if read != 2 || c.Stats().L3CostProbes != 2 {
		t.Fatalf("%d of %d skips read (%d probes counted), want 2", read, 2*probeEvery, c.Stats().L3CostProbes)
	}
}
