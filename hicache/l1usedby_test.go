package hicache

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cpcache/cpcache/parallel"
)

// TestL1UsedByIsEveryRanksPool: after an engine-owned insert of 10 pages at CP4 (pages 3, 3,
// 2, 2 per rank), every rank reports every rank's pool use alike, from which an engine
// decides room identically everywhere; a CP rank outside the group is an error naming it.
func TestL1UsedByIsEveryRanksPool(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true},
		opts: Options{PageSize: 4, L1Pages: 8, L1Mode: EngineOwned}, pagesPerSlab: 16, pageBytes: 64})
	tokens := make([]int32, 4*10)
	for i := range tokens {
		tokens[i] = int32(7 + i)
	}
	want := []int{3, 3, 2, 2}
	err := r.each("insert", func(i int, c *Cache) error {
		own := make([]int32, want[i]) // this rank's pages i, i+4, ...: slots 0, 1, ...
		for k := range own {
			own[k] = int32(k)
		}
		_, err := c.InsertSlots(Request{Tokens: tokens}, own)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.each("used by", func(i int, c *Cache) error {
		for rank, w := range want {
			got, err := c.L1UsedBy(rank)
			if err != nil || got != w {
				return fmt.Errorf("rank %d: L1UsedBy(%d) = %d, %v; want %d", i, rank, got, err, w)
			}
		}
		if _, err := c.L1UsedBy(4); !errors.Is(err, ErrBadArgument) {
			return fmt.Errorf("L1UsedBy(4) = %v, want ErrBadArgument", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
