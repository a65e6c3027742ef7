package hostengine

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
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

// An L1 pool whose size overflows int is refused with ErrBadConfig naming it: the engine
// neither panics allocating a negative size nor accepts a pool the product wrapped to the
// size of (a zero-byte pool for 2^40 pages of 2^40 bytes); slots are int32, so more pages
// than that are refused too.
func TestPoolSizeOverflow(t *testing.T) {
	slabs := kvtest.NewMemSlabs([]int{0}, 4, 64)
	for _, tc := range []struct {
		pages, pageBytes int
		pool             []byte
	}{
		{math.MaxInt32, math.MaxInt / 4, nil},   // the product is negative
		{1 << 30, 1 << 34, nil},                 // 2^64 wraps to 0
		{1 << 30, 1 << 34, []byte{}},            // ... and matches a zero-byte pool
		{math.MaxInt32 + 1, 1, make([]byte, 0)}, // more slots than an int32 names
		{3, math.MaxInt/2 + 1, make([]byte, 0)}, // odd product wraps
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("New(%d pages × %d bytes) panicked: %v", tc.pages, tc.pageBytes, r)
				}
			}()
			e, err := New(slabs, tc.pages, tc.pageBytes, Options{Pool: tc.pool})
			if !errors.Is(err, core.ErrBadConfig) || !strings.Contains(err.Error(), strconv.Itoa(tc.pages)) {
				t.Errorf("New(%d pages × %d bytes): %v, want ErrBadConfig naming the size", tc.pages, tc.pageBytes, err)
			}
			e.Close()
		}()
	}
}

// A transfer between an L1 page and an L2 page of another size fails with ErrBadConfig
// instead of copying the shorter length (which left the rest of the destination stale and
// reported success).
func TestPageSizeMismatchFails(t *testing.T) {
	slabs := kvtest.NewMemSlabs([]int{0}, 4, 64)
	e, err := New(slabs, 4, 32, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, k := range []core.Kind{core.Write, core.Load} {
		err := e.Submit(core.Transfer{Kind: k, Copies: []core.Copy{{L1: 0, L2: slab.Page{Slab: 0, Index: 1}}}}).Err()
		if !errors.Is(err, core.ErrBadConfig) {
			t.Errorf("%s between a 32-byte L1 page and a 64-byte L2 page: %v, want ErrBadConfig", k, err)
		}
	}
}
