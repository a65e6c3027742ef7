package gloo_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/multiproc"
)

func fileStore(t testing.TB) string { return "file://" + t.TempDir() }

func TestConformance(t *testing.T) {
	for _, n := range []int{2, 8, 16} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			soak := 40
			if n == 16 {
				soak = 8
			}
			multiproc.Run(t, multiproc.Spec{Role: "conformance", N: n, Timeout: 3 * time.Minute,
				Env: []string{"CPCACHE_STORE=" + fileStore(t), fmt.Sprintf("CPCACHE_TEST_SOAK=%d", soak)}})
		})
	}
}

// TestGlooAlgorithms runs the suite with the direct exchange disabled, so that the paths
// large groups take (Gloo's ring allreduce, allgatherv, broadcast and barrier) are covered.
func TestGlooAlgorithms(t *testing.T) {
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			multiproc.Run(t, multiproc.Spec{Role: "conformance", N: n, Timeout: 2 * time.Minute,
				Env: []string{"CPCACHE_STORE=" + fileStore(t), "CPCACHE_TEST_SOAK=16", "CPCACHE_GLOO_DIRECT_MAX=0"}})
		})
	}
	t.Run("peer-exit", func(t *testing.T) {
		multiproc.Run(t, multiproc.Spec{Role: "peer-exit", N: 4, Timeout: 90 * time.Second,
			Env: []string{"CPCACHE_STORE=" + fileStore(t), "CPCACHE_TEST_EXIT=exit", "CPCACHE_TEST_TIMEOUT=10m", "CPCACHE_GLOO_DIRECT_MAX=0"}})
	})
}

func TestLayoutGroups(t *testing.T) {
	// CP8 DP2 EP16 on 16 ranks: attention-CP groups {0..7},{8..15}, 16 single-rank
	// attention-TP groups, one EP and one TP group of 16.
	multiproc.Run(t, multiproc.Spec{Role: "layout", N: 16, Timeout: 3 * time.Minute,
		Env: []string{"CPCACHE_STORE=" + fileStore(t), "CPCACHE_TEST_DP=2", "CPCACHE_TEST_CP=8", "CPCACHE_TEST_EP=16"}})
}

func TestPeerExit(t *testing.T) {
	for _, how := range []string{"exit", "close"} {
		for _, n := range []int{2, 8} {
			t.Run(fmt.Sprintf("%s/ranks=%d", how, n), func(t *testing.T) {
				// The group timeout is far beyond the run's limit: only prompt detection passes.
				res := multiproc.Run(t, multiproc.Spec{Role: "peer-exit", N: n, Timeout: 90 * time.Second,
					Env: []string{"CPCACHE_STORE=" + fileStore(t), "CPCACHE_TEST_EXIT=" + how, "CPCACHE_TEST_TIMEOUT=10m"}})
				t.Logf("rank 0: %s", res[0].Output)
			})
		}
	}
}

func TestPeerStall(t *testing.T) {
	for _, mode := range []string{"ctx", "group"} {
		t.Run(mode, func(t *testing.T) {
			res := multiproc.Run(t, multiproc.Spec{Role: "peer-stall", N: 4, Timeout: 90 * time.Second,
				Env: []string{"CPCACHE_STORE=" + fileStore(t), "CPCACHE_TEST_MODE=" + mode, "CPCACHE_TEST_TIMEOUT=2s"}})
			t.Logf("rank 0: %s", res[0].Output)
		})
	}
}

// TestStaleStore reuses one store directory for consecutive runs: keys of the first run
// (Gloo's FileStore refuses to overwrite them) must not disturb the second.
func TestStaleStore(t *testing.T) {
	store := fileStore(t)
	for run := 0; run < 2; run++ {
		multiproc.Run(t, multiproc.Spec{Role: "conformance", N: 3, Timeout: time.Minute,
			Env: []string{"CPCACHE_STORE=" + store, "CPCACHE_TEST_SOAK=4"}})
	}
}

func TestNewGroupMismatch(t *testing.T) {
	multiproc.Run(t, multiproc.Spec{Role: "new-group-mismatch", N: 2, Timeout: time.Minute,
		Env: []string{"CPCACHE_STORE=" + fileStore(t)}})
}

func TestOpMismatch(t *testing.T) {
	// 3 ranks exchange frames all-to-all, 6 through rank 0.
	for _, n := range []int{3, 6} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			res := multiproc.Run(t, multiproc.Spec{Role: "op-mismatch", N: n, Timeout: time.Minute,
				Env: []string{"CPCACHE_STORE=" + fileStore(t)}})
			t.Logf("rank %d: %s", n-1, res[n-1].Output)
		})
	}
}

func TestEmptyAllReduceIsACollective(t *testing.T) {
	multiproc.Run(t, multiproc.Spec{Role: "empty-allreduce", N: 3, Timeout: 2 * time.Minute,
		Env: []string{"CPCACHE_STORE=" + fileStore(t)}})
}
