package gloo_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/internal/testenv/netnstest"
)

// TestTwoHosts runs 16 ranks on two "machines": two network namespaces joined by a veth
// pair, 8 ranks in each, a Redis store in the first. The ranks build the CP8 DP2 EP16 layout
// and check the world, every layout group (the CP groups live each in one namespace, the
// world and EP groups span both) and a sub-group across them.
func TestTwoHosts(t *testing.T) {
	hosts := netnstest.New(t, "cpc", 213)
	// The namespace is new: nothing listens in it yet.
	port := startRedis(t, hosts.Addr[0], 6379, hosts.Exec(0))
	const perHost = 8
	multiproc.Run(t, multiproc.Spec{
		Role: "layout", N: 2 * perHost, Timeout: 3 * time.Minute,
		Env: []string{fmt.Sprintf("CPCACHE_STORE=redis://%s:%d/twohosts", hosts.Addr[0], port),
			"CPCACHE_TEST_DP=2", "CPCACHE_TEST_CP=8", "CPCACHE_TEST_EP=16"},
		RankEnv: hosts.RankEnv(perHost),
		Wrap:    hosts.Wrap(perHost),
	})
}
