package kvtest

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/slab"
)

func TestCheckKVCatchesMisplacement(t *testing.T) {
	for _, size := range []int{1, 7, 64, 4099} {
		b := make([]byte, size)
		FillKV(b, 0xabc, 5, 1)
		if err := CheckKV(b, 0xabc, 5, 1); err != nil {
			t.Fatalf("size %d: own content rejected: %v", size, err)
		}
		for _, other := range []struct {
			hash         uint64
			index, shard int
		}{{0xabd, 5, 1}, {0xabc, 6, 1}, {0xabc, 5, 0}} {
			if CheckKV(b, other.hash, other.index, other.shard) == nil {
				t.Fatalf("size %d: content of (0xabc,5,1) accepted as %+v", size, other)
			}
		}
		b[size-1] ^= 1
		if err := CheckKV(b, 0xabc, 5, 1); err == nil || !strings.Contains(err.Error(), "byte") {
			t.Fatalf("size %d: flipped last byte: %v", size, err)
		}
	}
}

func TestMemSlabsBoundsAndSharing(t *testing.T) {
	m := NewMemSlabs([]int{4, 5}, 3, 16)
	if m.PageSize() != 16 || m.PagesPerSlab() != 3 || len(m.Ranks()) != 2 {
		t.Fatalf("shape %d %d %v", m.PageSize(), m.PagesPerSlab(), m.Ranks())
	}
	p, err := m.Page(slab.Page{Slab: 1, Index: 2})
	if err != nil || len(p) != 16 || cap(p) != 16 {
		t.Fatalf("page: len %d cap %d err %v", len(p), cap(p), err)
	}
	p[0] = 9
	q, _ := m.Page(slab.Page{Slab: 1, Index: 2})
	if q[0] != 9 || m.Snapshot()[1][2*16] != 9 {
		t.Fatal("pages are not shared memory")
	}
	for _, bad := range []slab.Page{{Slab: 2}, {Slab: -1}, {Index: 3}, {Index: -1}} {
		if _, err := m.Page(bad); err == nil || !strings.Contains(err.Error(), bad.String()) {
			t.Fatalf("page %v: %v", bad, err)
		}
	}
}
