package shm_test

import (
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/internal/testenv/netnstest"
	"github.com/cpcache/cpcache/parallel/shm"
)

// TestTwoHostsSelectGloo runs 4 ranks on two "machines" (two network namespaces joined by
// a veth pair, 2 ranks in each, rendezvous through a file store): their host identities
// differ, so Consensus picks the Gloo group with the default setting and fails with
// ErrNotLocal (naming the network namespace) when shared memory is required.
func TestTwoHostsSelectGloo(t *testing.T) {
	hosts := netnstest.New(t, "cps", 214)
	const perHost = 2
	for _, tc := range []struct{ setting, want string }{{"auto", shm.BackendBootstrap}, {"shm", "not-local"}} {
		t.Run("backend="+tc.setting, func(t *testing.T) {
			multiproc.Run(t, multiproc.Spec{
				Role: "select", N: 2 * perHost, Timeout: 2 * time.Minute,
				Env:     append(rankEnv(t, 0), shm.EnvBackend+"="+tc.setting, envWant+"="+tc.want),
				RankEnv: hosts.RankEnv(perHost),
				Wrap:    hosts.Wrap(perHost),
			})
		})
	}
}
