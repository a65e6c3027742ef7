package gloo_test

import (
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/shimdigest"
)

// TestShimDigest covers every csrc/gloo_* file: shim.cc and collectives.cc include the two
// .cc files and both include the headers, and any edit of shim.cc rebuilds the whole package.
func TestShimDigest(t *testing.T) {
	shimdigest.Check(t, "shim.cc", "gloo_*")
}
