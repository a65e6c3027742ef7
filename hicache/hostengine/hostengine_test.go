package hostengine

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/slab"
)

// A caller-owned pool is the engine's L1: a load-back lands in it, a backup reads from it;
// a pool of the wrong size is refused.
func TestCallerOwnedPool(t *testing.T) {
	const pages, pb = 4, 64
	slabs := kvtest.NewMemSlabs([]int{0}, pages, pb)
	if _, err := New(slabs, pages, pb, Options{Pool: make([]byte, pages*pb-1)}); !errors.Is(err, core.ErrBadConfig) {
		t.Fatalf("short pool: %v, want ErrBadConfig", err)
	}
	pool := make([]byte, pages*pb)
	e, err := New(slabs, pages, pb, Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src, _ := slabs.Page(slab.Page{Slab: 0, Index: 2})
	copy(src, bytes.Repeat([]byte{7}, pb))
	load := core.Transfer{Kind: core.Load, Copies: []core.Copy{{L1: 1, L2: slab.Page{Slab: 0, Index: 2}}}}
	if err := e.Submit(load).Err(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pool[pb:2*pb], src) {
		t.Fatal("the load did not land in the caller's pool")
	}
	copy(pool[3*pb:], bytes.Repeat([]byte{9}, pb))
	write := core.Transfer{Kind: core.Write, Copies: []core.Copy{{L1: 3, L2: slab.Page{Slab: 0, Index: 0}}}}
	if err := e.Submit(write).Err(); err != nil {
		t.Fatal(err)
	}
	if dst, _ := slabs.Page(slab.Page{Slab: 0, Index: 0}); !bytes.Equal(dst, pool[3*pb:]) {
		t.Fatal("the backup did not read the caller's pool")
	}
}
