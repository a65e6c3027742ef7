package redistest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of three masters, each with one replica, owned by one test:
// six redis-server processes on free loopback ports (their cluster bus ports free too),
// joined by redis-cli --cluster create. The test's cleanup kills every node.
type Cluster struct {
	t     testing.TB
	Nodes []*Server
	tls   *TLSFiles
	pass  string
}

// clusterNodeTimeout is the nodes' cluster-node-timeout: a master that does not answer for
// that long is failed and its replica promoted within about a second more.
const clusterNodeTimeout = "1000"

// StartCluster starts a cluster, with extra redis-server flags for every node (e.g.
// "--requirepass", pw, "--masterauth", pw), and returns once every node reports
// cluster_state:ok and every replica is in sync. It skips the test when redis-server or
// redis-cli is not installed (Debian packages redis-server and redis-tools; `make deps`).
func StartCluster(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	return startCluster(t, nil, extra)
}

// StartClusterTLS is StartCluster for nodes that speak only TLS (clients, replication and
// the cluster bus), with the certificates of files.
func StartClusterTLS(t testing.TB, files *TLSFiles, extra ...string) *Cluster {
	t.Helper()
	// A node dials the others (bus, replication) with the client certificate: the server's
	// is for servers only.
	return startCluster(t, files, append([]string{"--tls-cluster", "yes", "--tls-replication", "yes",
		"--tls-client-cert-file", files.ClientCert, "--tls-client-key-file", files.ClientKey}, extra...))
}

func startCluster(t testing.TB, files *TLSFiles, extra []string) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skipf("redis-cli is not installed (Debian package redis-tools, a dependency of redis-server; `make deps`): %v", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skipf("redis-server is not installed (Debian package redis-server, `make deps`): %v", err)
	}
	c := &Cluster{t: t, tls: files}
	if i := slices.Index(extra, "--requirepass"); i >= 0 && i+1 < len(extra) {
		c.pass = extra[i+1]
	}
	for range 6 {
		c.Nodes = append(c.Nodes, startWith(t, files, func() []string {
			conf := filepath.Join(t.TempDir(), "nodes.conf")
			return append([]string{"--cluster-enabled", "yes", "--cluster-config-file", conf,
				"--cluster-port", strconv.Itoa(freePort(t)), "--cluster-node-timeout", clusterNodeTimeout,
				// A replica takes over however long it was cut off from its master.
				"--cluster-replica-validity-factor", "0"}, extra...)
		}))
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(append(args, "--cluster-replicas", "1", "--cluster-yes"), c.cliFlags()...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(30 * time.Second)
	c.WaitReplicated(30 * time.Second)
	return c
}

// cliFlags are redis-cli's flags for the nodes' password and TLS.
func (c *Cluster) cliFlags() []string {
	var f []string
	if c.pass != "" {
		f = append(f, "-a", c.pass, "--no-auth-warning")
	}
	if c.tls != nil {
		f = append(f, "--tls", "--cacert", c.tls.CA, "--cert", c.tls.ClientCert, "--key", c.tls.ClientKey)
	}
	return f
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addrs are the nodes' host:port, masters and replicas.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr())
	}
	return a
}

// URL is a cpcache storage URL for the cluster with a key prefix: redis+cluster:// naming
// every node, or rediss+cluster:// with the CA and client certificate. It has no password.
func (c *Cluster) URL(prefix string) string {
	u := "redis+cluster://" + strings.Join(c.Addrs(), ",") + "/" + url.PathEscape(prefix)
	if c.tls != nil {
		u = "rediss+cluster://" + strings.Join(c.Addrs(), ",") + "/" + url.PathEscape(prefix) + "?" + c.tls.Query()
	}
	return u
}

// Client is a go-redis cluster client (with the nodes' password and TLS), for tests that
// look at or change what is stored. The test's cleanup closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	c.t.Helper()
	cl := c.newClient()
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// newClient is Client without the cleanup: the caller closes it.
func (c *Cluster) newClient() *redis.ClusterClient {
	c.t.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs(), Password: c.pass, DisableIdentity: true}
	if c.tls != nil {
		o.TLSConfig = c.tls.ClientConfig(c.t)
		o.TLSConfig.ServerName = "" // each node's address
	}
	return redis.NewClusterClient(o)
}

// live are the nodes that run.
func (c *Cluster) live() []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		n.mu.Lock()
		up := n.cmd != nil
		n.mu.Unlock()
		if up {
			out = append(out, n)
		}
	}
	return out
}

// Masters are the running nodes whose role is master.
func (c *Cluster) Masters() []*Server {
	c.t.Helper()
	var out []*Server
	for _, n := range c.live() {
		info, err := n.info("replication")
		if err == nil && info["role"] == "master" {
			out = append(out, n)
		}
	}
	return out
}

// info is a section of the node's INFO, field by field.
func (s *Server) info(section string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl := s.newClient()
	defer cl.Close()
	raw, err := cl.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(raw, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// MasterOf is the master that serves key now.
func (c *Cluster) MasterOf(key string) *Server {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := c.newClient()
	defer cl.Close()
	m, err := cl.MasterForKey(ctx, key)
	if err != nil {
		c.t.Fatalf("redistest: master of %q: %v", key, err)
	}
	for _, n := range c.Nodes {
		if n.Addr() == m.Options().Addr {
			return n
		}
	}
	c.t.Fatalf("redistest: master of %q is %s, not a node of the cluster", key, m.Options().Addr)
	return nil
}

// DBSize is the number of keys the running masters hold.
func (c *Cluster) DBSize() (int, error) {
	total := 0
	for _, m := range c.Masters() {
		n, err := m.DBSize()
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// WaitOK waits until every running node reports cluster_state:ok (every slot served by a
// master that runs, once a killed master's replica has taken over); it fails the test
// after timeout.
func (c *Cluster) WaitOK(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		bad := ""
		live := c.live()
		for _, n := range live {
			info, err := n.clusterInfo()
			if err != nil || info["cluster_state"] != "ok" {
				bad = fmt.Sprintf("%v: cluster_state %q, %v", n, info["cluster_state"], err)
				break
			}
			if m := n.deadMaster(live); m != "" {
				bad = fmt.Sprintf("%v: slots served by %s, which is down", n, m)
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: cluster not ok after %v: %s", timeout, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deadMaster is a master in s's slot map that is not one of live ("" when all are).
func (s *Server) deadMaster(live []*Server) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl := s.newClient()
	defer cl.Close()
	//lint:ignore SA1019 CLUSTER SLOTS is the slot map go-redis routes by (it still loads it with that command)
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return err.Error()
	}
	covered := 0
	for _, r := range slots {
		covered += r.End - r.Start + 1
		if len(r.Nodes) == 0 || !slices.ContainsFunc(live, func(n *Server) bool { return n.Addr() == r.Nodes[0].Addr }) {
			return fmt.Sprintf("slots %d-%d (%v)", r.Start, r.End, r.Nodes)
		}
	}
	if covered != 16384 {
		return fmt.Sprintf("%d of 16384 slots", covered)
	}
	return ""
}

func (s *Server) clusterInfo() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl := s.newClient()
	defer cl.Close()
	raw, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(raw, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// WaitReplicated waits until every running master has a replica that is online and has
// acknowledged the master's whole replication stream: what was written before is on a
// replica, and survives the master's death. It fails the test after timeout.
func (c *Cluster) WaitReplicated(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		bad := ""
		for _, m := range c.Masters() {
			info, err := m.info("replication")
			if err != nil {
				bad = fmt.Sprintf("%v: %v", m, err)
				break
			}
			// slave0:ip=127.0.0.1,port=P,state=online,offset=N,lag=0
			replica := info["slave0"]
			if !strings.Contains(replica, "state=online") || !strings.Contains(replica+",", ",offset="+info["master_repl_offset"]+",") {
				bad = fmt.Sprintf("%v: master offset %s, replica %q", m, info["master_repl_offset"], replica)
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: replicas not in sync after %v: %s", timeout, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
