package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/gloo"
)

// Pair is two network namespaces joined by a veth pair.
type Pair struct {
	NS   [2]string // namespace names
	Addr [2]string // IPv4 address of each namespace's end of the link (a /24)
}

// New creates the two namespaces "<tag>A<id>" and "<tag>B<id>", a veth pair between them
// with addresses 10.<octet>.<id%250>.1 and .2, and brings up the link and loopback in both.
// It skips t when that is impossible here, and removes the namespaces at cleanup.
func New(t testing.TB, tag string, octet int) *Pair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip: ", err)
	}
	id := os.Getpid() % 100000
	subnet := fmt.Sprintf("10.%d.%d", octet, id%250)
	p := &Pair{
		NS:   [2]string{fmt.Sprintf("%sA%d", tag, id), fmt.Sprintf("%sB%d", tag, id)},
		Addr: [2]string{subnet + ".1", subnet + ".2"},
	}
	if err := ip("netns", "add", p.NS[0]); err != nil {
		t.Skip("ip netns does not work here: ", err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", p.NS[0]) })
	if err := ip("netns", "add", p.NS[1]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", p.NS[1]) })
	vethA, vethB := fmt.Sprintf("%sva%d", tag, id), fmt.Sprintf("%svb%d", tag, id)
	nsA, nsB := p.NS[0], p.NS[1]
	for _, args := range [][]string{
		{"link", "add", vethA, "netns", nsA, "type", "veth", "peer", "name", vethB, "netns", nsB},
		{"-n", nsA, "addr", "add", p.Addr[0] + "/24", "dev", vethA},
		{"-n", nsB, "addr", "add", p.Addr[1] + "/24", "dev", vethB},
		{"-n", nsA, "link", "set", vethA, "up"},
		{"-n", nsB, "link", "set", vethB, "up"},
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netnstest: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Exec is the command prefix that runs a command inside namespace host (0 or 1).
func (p *Pair) Exec(host int) []string { return []string{"ip", "netns", "exec", p.NS[host]} }

// RankEnv is a multiproc.Spec RankEnv for perHost ranks per namespace: the local rank and
// local world size of each rank, and its namespace's address as its Gloo hostname.
func (p *Pair) RankEnv(perHost int) func(rank int) []string {
	return func(rank int) []string {
		return []string{fmt.Sprintf("LOCAL_RANK=%d", rank%perHost), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", perHost),
			gloo.EnvHostname + "=" + p.Addr[host(rank, perHost)]}
	}
}

// Wrap is a multiproc.Spec Wrap that starts ranks [0, perHost) in the first namespace and
// the others in the second.
func (p *Pair) Wrap(perHost int) func(rank int, argv []string) []string {
	return func(rank int, argv []string) []string {
		return append(p.Exec(host(rank, perHost)), argv...)
	}
}

func host(rank, perHost int) int {
	if rank >= perHost {
		return 1
	}
	return 0
}
