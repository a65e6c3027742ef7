package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/zmq"
)

// badKVEventFlags are --kv-events flags every rank would fail on, with what the error says.
// The default layout has two DP replicas: replica 1 uses the port plus 1.
var badKVEventFlags = []struct {
	args []string
	want string
}{
	{[]string{"--kv-events", "tcp://*"}, `--kv-events "tcp://*": kvevents: endpoint "tcp://*" has no port`},
	{[]string{"--kv-events", "tcp://*:99999"}, `--kv-events "tcp://*:99999": kvevents: endpoint "tcp://*:99999": port 99999 is out of range (0-65535)`},
	{[]string{"--kv-events", "tcp://*:65535"}, `--kv-events "tcp://*:65535": kvevents: endpoint "tcp://*:65535": replica 1 would use port 65536, above 65535`},
	{[]string{"--kv-events", "bogus://x"}, `--kv-events "bogus://x": kvevents: endpoint "bogus://x": unknown scheme "bogus" (want tcp, ipc or inproc)`},
	{[]string{"--kv-events", "tcp://*:5557", "--kv-events-replay", "tcp://host:5558"}, `--kv-events-replay "tcp://host:5558": kvevents: endpoint "tcp://host:5558" is bound: host "host" is not *, an IP address or localhost`},
	{[]string{"--kv-events", "tcp://*:5557", "--kv-events-replay", "tcp://*:70000"}, `--kv-events-replay "tcp://*:70000": kvevents: endpoint "tcp://*:70000": port 70000 is out of range`},
	{[]string{"--kv-events", "tcp://*:5557", "--kv-events-replay", "ipc:///tmp/replay"}, `--kv-events-replay "ipc:///tmp/replay": kvevents: endpoint "ipc:///tmp/replay": want tcp:// or inproc:// to offset for replica 1`},
	{[]string{"--kv-events", "tcp://*:5557", "--kv-events-history-mib", "-1"}, "--kv-events-history-mib -1 is negative"},
}

// TestRunRefusesBadKVEventEndpoints: cpcache run refuses a bad endpoint with exit 2 and one
// line naming the flag and the value, before any rank starts.
func TestRunRefusesBadKVEventEndpoints(t *testing.T) {
	for _, c := range badKVEventFlags {
		status, out, errOut := runCmd(append([]string{"run"}, c.args...)...)
		assert.Equal(t, 2, status, "%v: %s", c.args, errOut)
		assert.Empty(t, out, c.args)
		assert.Contains(t, errOut, c.want, c.args)
		assert.NotContains(t, errOut, "starting", "%v: no rank may start", c.args)
		assert.Len(t, strings.Split(strings.TrimSpace(errOut), "\n"), 1, "%v: one line: %q", c.args, errOut)
	}
}

// TestLaunchRefusesBadKVEventEndpoints: under cpcache launch every rank refuses the flag
// while it checks its flags, before joining the others: the job exits 2 naming the value.
func TestLaunchRefusesBadKVEventEndpoints(t *testing.T) {
	bin := cpcacheBinary(t)
	for _, c := range badKVEventFlags[:4] {
		args := append([]string{"launch", "-n", "2", "--", bin, "run", "--world", "2", "--dp", "2", "--attn-cp", "1"}, c.args...)
		cmd := exec.Command(bin, args...)
		cmd.Env = withoutLauncherEnv(nil)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v: %s", c.args, out)
		assert.Equal(t, 2, ee.ExitCode(), "%v: %s", c.args, out)
		assert.Contains(t, string(out), c.want, c.args)
		assert.NotContains(t, string(out), "starting", "%v: no rank may start", c.args)
	}
}

// TestKVEventsWithoutLibzmq: libzmq is loaded only for --kv-events: without it a run
// without events works, and --kv-events exits 2 naming the library and its Debian package.
func TestKVEventsWithoutLibzmq(t *testing.T) {
	env := []string{zmq.Env + "=/nonexistent/libzmq.so.5"}
	status, _, _, errOut := runBinary(t, env, append([]string{"--world", "2", "--dp", "1", "--attn-cp", "2"}, smallSynthetic...)...)
	assert.Equal(t, 0, status, errOut)
	status, _, out, errOut := runBinary(t, env, append([]string{"--world", "2", "--dp", "1", "--attn-cp", "2", "--kv-events", "tcp://*:5557"}, smallSynthetic...)...)
	assert.Equal(t, 2, status, errOut)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "--kv-events tcp://*:5557: zmq: cannot load libzmq.so.5")
	assert.Contains(t, errOut, "install Debian's libzmq5")
	assert.NotContains(t, errOut, "starting")
}
