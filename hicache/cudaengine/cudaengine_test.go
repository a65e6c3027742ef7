package cudaengine

import (
	"errors"
	"testing"

	"github.com/cpcache/cpcache/hicache/core"
)

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := New(nil, 0, 8, 64, nil, Options{})
	if !errors.Is(err, core.ErrBadConfig) {
		t.Fatalf("New without a device: %v, want ErrBadConfig", err)
	}
}
