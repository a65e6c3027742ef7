package core

import (
	"testing"
)

// A prefetch inserted below an L2-only prefix keeps the LRU lists' order (every node behind
// its descendants), so one EvictL2 pass frees the new leaf and then its parent.
func TestPrefetchBelowL2OnlyNodeKeepsEvictionOrder(t *testing.T) {
	c, err := New(Config{Options: Options{PageSize: 2, L1Pages: 16}, Slabs: 1, PagesPerSlab: 16, L3: true})
	if err != nil {
		t.Fatal(err)
	}
	step := func(d Done) Ready { t.Helper(); return stepSolo(t, c, d) }
	prefix := []int32{1, 1, 2, 2}
	if _, err := c.Insert(Request{Tokens: prefix}); err != nil {
		t.Fatal(err)
	}
	rd := c.Ready() // the write-through backup
	rd = step(Done{Transfers: []TransferDone{{Kind: Write, Seq: rd.Transfers[0].Seq}}})
	if len(rd.Jobs) != 1 || rd.Jobs[0].Kind != StoragePut { // the backup to storage
		t.Fatalf("jobs %+v, want a storage backup", rd.Jobs)
	}
	step(Done{Storage: []StorageDone{{Kind: StoragePut, Seq: rd.Jobs[0].Seq}}})
	if freed, _ := c.EvictL1(2); freed != 2 || c.Peek(Request{Tokens: prefix}).State != StateL2 {
		t.Fatalf("freed %d, prefix %v; want it held in L2 only", freed, c.Peek(Request{Tokens: prefix}).State)
	}
	long := append(append([]int32(nil), prefix...), 3, 3, 4, 4)
	if res := c.Prefetch(Request{Tokens: long}); res.ID == 0 || res.Start != 2 || res.Pages != 2 {
		t.Fatalf("prefetch %+v", res)
	}
	rd = c.Ready()
	rd = step(Done{Storage: []StorageDone{{Kind: StorageQuery, Seq: rd.Jobs[0].Seq, Pages: 2}}})
	if len(rd.Jobs) != 1 || rd.Jobs[0].Kind != StorageRead {
		t.Fatalf("jobs %+v, want a storage read", rd.Jobs)
	}
	step(Done{Storage: []StorageDone{{Kind: StorageRead, Seq: rd.Jobs[0].Seq, Pages: 2}}})
	if n := c.Peek(Request{Tokens: long}); n.Handle == 0 || n.Depth != 2 || n.State != StateL2 {
		t.Fatalf("prefetched node %v, want 2 pages below the prefix in L2", n)
	}
	if freed := c.EvictL2(4); freed != 4 || c.Nodes() != 0 {
		t.Fatalf("EvictL2(4) freed %d pages, %d nodes left; want the prefetched leaf and its parent", freed, c.Nodes())
	}
}
