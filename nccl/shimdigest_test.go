package nccl_test

import (
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/shimdigest"
)

func TestShimDigest(t *testing.T) {
	shimdigest.Check(t, "shim.c", "loader.h", "loader_status.h", "nccl_api.h", "nccl_loader.c")
}
