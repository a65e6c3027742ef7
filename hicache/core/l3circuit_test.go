package core

import (
	"testing"
)

// Any rank's breaker opens the storage circuit (every rank does storage I/O with its own
// handle); the group agrees it at one step, and while it is open no rank starts a prefetch
// or queues storage work; it closes at the step every rank's breaker is closed again.
func TestStorageCircuitAgreed(t *testing.T) {
	const n = 4
	cores := make([]*Core, n)
	for i := range cores {
		c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 32}, Slabs: n, PagesPerSlab: 32, CPRank: i, L3: true})
		if err != nil {
			t.Fatal(err)
		}
		cores[i] = c
	}
	r := &coreRig{cores: cores}
	step := func() {
		t.Helper()
		for i, err := range r.stepAll() {
			if err != nil {
				t.Fatalf("rank %d: %v", i, err)
			}
		}
	}
	open := func(want bool) {
		t.Helper()
		for i, c := range cores {
			if c.StorageCircuitOpen() != want {
				t.Fatalf("rank %d: circuit open %t, want %t", i, c.StorageCircuitOpen(), want)
			}
		}
	}
	tokens := make([]int32, 16)
	for i := range tokens {
		tokens[i] = int32(i + 1)
	}

	cores[3].StorageCircuit(true)
	open(false) // agreed only at the next step
	step()
	open(true)
	cores[1].StorageCircuit(true)
	cores[3].StorageCircuit(false)
	step()
	open(true) // rank 1's is still open
	for i, c := range cores {
		if res := c.Prefetch(Request{Tokens: tokens}); res.ID != 0 {
			t.Fatalf("rank %d: prefetch %+v started with the circuit open", i, res)
		}
		if rd := c.Ready(); len(rd.Jobs) != 0 {
			t.Fatalf("rank %d: storage jobs %+v queued with the circuit open", i, rd.Jobs)
		}
	}
	cores[1].StorageCircuit(false)
	step()
	open(false)
	for i, c := range cores {
		if res := c.Prefetch(Request{Tokens: tokens}); res.ID == 0 {
			t.Fatalf("rank %d: no prefetch once the circuit closed", i)
		}
		// 4 pages, one per rank: each queries its own
		if rd := c.Ready(); len(rd.Jobs) != 1 || rd.Jobs[0].Kind != StorageQuery || len(rd.Jobs[0].Hashes) != 1 {
			t.Fatalf("rank %d: jobs %+v, want one query of its one page", i, rd.Jobs)
		}
	}
}
