package cudaengine

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache/core"
)

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := New(nil, 0, 8, 64, nil, Options{})
	if !errors.Is(err, core.ErrBadConfig) {
		t.Fatalf("New without a device: %v, want ErrBadConfig", err)
	}
}

// An L1 pool whose size or end overflows is refused with ErrBadConfig naming it, before any
// device work: slot addresses (L1 + slot × pageBytes) would wrap onto other memory.
func TestNewRejectsOverflowingPool(t *testing.T) {
	for _, tc := range []struct {
		l1               cuda.DevicePtr
		pages, pageBytes int
	}{
		{0x1000, math.MaxInt32, math.MaxInt / 4},
		{0x1000, 1 << 30, 1 << 34},
		{0x1000, math.MaxInt32 + 1, 1},
		{math.MaxUint64 - 0xff, 4, 64},
	} {
		_, err := New(nil, tc.l1, tc.pages, tc.pageBytes, nil, Options{})
		if !errors.Is(err, core.ErrBadConfig) || !strings.Contains(err.Error(), "overflows") {
			t.Errorf("New(%v, %d pages × %d bytes): %v, want ErrBadConfig for the overflow", tc.l1, tc.pages, tc.pageBytes, err)
		}
	}
}
