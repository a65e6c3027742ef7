package main

import (
	"math"
	"testing"
	"time"
)

// TestWaitLimit: cpcache_wait_l1's timeout_ms. INT64_MAX, what a C caller passes for
// "forever", must not wrap around to a deadline already passed (a wait that times out at
// once).
func TestWaitLimit(t *testing.T) {
	for _, c := range []struct {
		ms    int64
		want  time.Duration
		limit bool
	}{
		{-1, 0, false},
		{math.MinInt64, 0, false},
		{0, 0, true},
		{1500, 1500 * time.Millisecond, true},
		{math.MaxInt64 / int64(time.Millisecond), time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond, true},
		{math.MaxInt64/int64(time.Millisecond) + 1, 0, false},
		{math.MaxInt64, 0, false},
	} {
		got, limit := waitLimit(c.ms)
		if got != c.want || limit != c.limit {
			t.Errorf("waitLimit(%d) = %v, %v; want %v, %v", c.ms, got, limit, c.want, c.limit)
		}
		if limit && got < 0 {
			t.Errorf("waitLimit(%d) = %v: a limit in the past", c.ms, got)
		}
	}
}
