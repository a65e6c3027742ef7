package cuda_test

import (
	"testing"

	"github.com/cpcache/cpcache/cuda/cudatest"
)

func TestShimDigest(t *testing.T) {
	cudatest.CheckShimDigest(t, "shim.c", "loader.h", "loader_status.h", "cuda_api.h", "cuda_loader.c")
}
