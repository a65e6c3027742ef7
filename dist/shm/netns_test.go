package shm_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/dist/shm"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/multiproc"
)

// TestTwoHostsSelectGloo runs 4 ranks on two "machines" (two network namespaces joined by
// a veth pair, 2 ranks in each, rendezvous through a file store): their host identities
// differ, so Consensus picks the Gloo group with the default setting and fails with
// ErrNotLocal (naming the network namespace) when shared memory is required.
func TestTwoHostsSelectGloo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip: ", err)
	}
	id := os.Getpid() % 100000
	nsA, nsB := fmt.Sprintf("cpsA%d", id), fmt.Sprintf("cpsB%d", id)
	subnet := fmt.Sprintf("10.214.%d", id%250)
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
	vethA, vethB := fmt.Sprintf("csva%d", id), fmt.Sprintf("csvb%d", id)
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
	const perHost = 2
	for _, tc := range []struct{ setting, want string }{{"auto", shm.BackendBootstrap}, {"shm", "not-local"}} {
		t.Run("backend="+tc.setting, func(t *testing.T) {
			multiproc.Run(t, multiproc.Spec{
				Role: "select", N: 2 * perHost, Timeout: 2 * time.Minute,
				Env: append(rankEnv(t, 0), shm.EnvBackend+"="+tc.setting, envWant+"="+tc.want),
				RankEnv: func(rank int) []string {
					addr := addrA
					if rank >= perHost {
						addr = addrB
					}
					return []string{fmt.Sprintf("LOCAL_RANK=%d", rank%perHost), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", perHost),
						gloo.EnvHostname + "=" + addr}
				},
				Wrap: func(rank int, argv []string) []string {
					ns := nsA
					if rank >= perHost {
						ns = nsB
					}
					return append([]string{"ip", "netns", "exec", ns}, argv...)
				},
			})
		})
	}
}
