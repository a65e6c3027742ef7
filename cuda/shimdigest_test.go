package cuda_test

import (
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/shimdigest"
)

func TestShimDigest(t *testing.T) {
	shimdigest.Check(t, "shim.c", "loader.h", "loader_status.h", "cuda_api.h", "cuda_loader.c")
}
