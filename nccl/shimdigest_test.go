package nccl_test

import (
	"testing"

	"github.com/cpcache/cpcache/cuda/cudatest"
)

func TestShimDigest(t *testing.T) {
	cudatest.CheckShimDigest(t, "shim.c", "loader.h", "loader_status.h", "nccl_api.h", "nccl_loader.c")
}
