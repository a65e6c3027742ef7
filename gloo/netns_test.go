package gloo_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/multiproc"
)

// TestTwoHosts runs 16 ranks on two "machines": two network namespaces joined by a veth
// pair, 8 ranks in each, a Redis store in the first. The ranks build the CP8 DP2 EP16 layout
// and check the world, every layout group (the CP groups live each in one namespace, the
// world and EP groups span both) and a sub-group across them.
func TestTwoHosts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip: ", err)
	}
	id := os.Getpid() % 100000
	nsA, nsB := fmt.Sprintf("cpcA%d", id), fmt.Sprintf("cpcB%d", id)
	subnet := fmt.Sprintf("10.213.%d", id%250)
	addrA, addrB := subnet+".1", subnet+".2"
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("netns", "add", nsA); err != nil {
		t.Skip("ip netns does not work here: ", err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", nsA) })
	if err := ip("netns", "add", nsB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", nsB) })
	vethA, vethB := fmt.Sprintf("cpva%d", id), fmt.Sprintf("cpvb%d", id)
	for _, args := range [][]string{
		{"link", "add", vethA, "netns", nsA, "type", "veth", "peer", "name", vethB, "netns", nsB},
		{"-n", nsA, "addr", "add", addrA + "/24", "dev", vethA},
		{"-n", nsB, "addr", "add", addrB + "/24", "dev", vethB},
		{"-n", nsA, "link", "set", vethA, "up"},
		{"-n", nsB, "link", "set", vethB, "up"},
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	// The namespace is new: nothing listens in it yet.
	port := startRedis(t, addrA, 6379, []string{"ip", "netns", "exec", nsA})
	const perHost = 8
	multiproc.Run(t, multiproc.Spec{
		Role: "layout", N: 2 * perHost, Timeout: 3 * time.Minute,
		Env: []string{fmt.Sprintf("CPCACHE_STORE=redis://%s:%d/twohosts", addrA, port),
			"CPCACHE_TEST_DP=2", "CPCACHE_TEST_CP=8", "CPCACHE_TEST_EP=16"},
		RankEnv: func(rank int) []string {
			addr := addrA
			if rank >= perHost {
				addr = addrB
			}
			return []string{fmt.Sprintf("LOCAL_RANK=%d", rank%perHost), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", perHost),
				"CPCACHE_GLOO_HOSTNAME=" + addr}
		},
		Wrap: func(rank int, argv []string) []string {
			ns := nsA
			if rank >= perHost {
				ns = nsB
			}
			return append([]string{"ip", "netns", "exec", ns}, argv...)
		},
	})
}
