package main

import (
	"slices"
	"testing"
)

// A freed-slot buffer takes the first slots it holds; the rest are kept (queued for
// cpcache_take_freed_l1), none lost and none twice, whatever the capacity.
func TestSplitFreedKeepsWhatDoesNotFit(t *testing.T) {
	slots := []int32{7, 3, 9}
	for _, tc := range []struct {
		capacity   uint64
		give, keep []int32
	}{
		{0, []int32{}, []int32{7, 3, 9}},
		{1, []int32{7}, []int32{3, 9}},
		{3, []int32{7, 3, 9}, []int32{}},
		{^uint64(0), []int32{7, 3, 9}, []int32{}}, // SIZE_MAX: a bound, not a length
	} {
		give, keep := splitFreed(slots, tc.capacity)
		if !slices.Equal(give, tc.give) || !slices.Equal(keep, tc.keep) {
			t.Errorf("capacity %d: give %v keep %v, want %v and %v", tc.capacity, give, keep, tc.give, tc.keep)
		}
	}
}
