package redistest

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A started server answers; killed, it does not; started again, it answers on the same
// port; a stopped server still counts as running for Signal; Close is idempotent.
func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if err := s.ping(); err != nil {
		t.Fatalf("%v after Start: %v", s, err)
	}
	addr := s.Addr()
	s.Kill()
	if err := s.ping(); err == nil {
		t.Fatalf("%v answers after Kill", s)
	}
	s.Start()
	if s.Addr() != addr || s.ping() != nil {
		t.Fatalf("restart: %s (was %s), ping %v", s.Addr(), addr, s.ping())
	}
	s.Signal(syscall.SIGSTOP)
	s.Signal(syscall.SIGCONT)
	if err := s.ping(); err != nil {
		t.Fatalf("after SIGSTOP+SIGCONT: %v", err)
	}
	for i := range 2 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	var none *Server
	if err := none.Close(); err != nil {
		t.Fatalf("nil Close: %v", err)
	}
	if err := s.ping(); err == nil {
		t.Fatal("server answers after Close")
	}
}

// A server that needs a password is ready too (its PING reply is NOAUTH).
func TestStartWithPassword(t *testing.T) {
	s := Start(t, "--requirepass", "pw")
	if got := s.URL("p"); got != "redis://"+s.Addr()+"/p" {
		t.Fatalf("URL = %q", got)
	}
}

// A started cluster has three masters, each with a replica in sync, and serves keys in
// every slot through a cluster client; killing a master promotes its replica.
func TestStartCluster(t *testing.T) {
	c := StartCluster(t)
	if got := len(c.Masters()); got != 3 {
		t.Fatalf("%d masters, want 3", got)
	}
	ctx := context.Background()
	cl := c.Client()
	for i := range 100 {
		if err := cl.Set(ctx, "k"+strconv.Itoa(i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := c.DBSize(); err != nil || n != 100 {
		t.Fatalf("DBSize = %d, %v; want 100", n, err)
	}
	c.WaitReplicated(10 * time.Second)
	m := c.MasterOf("k0")
	m.Kill()
	c.WaitOK(20 * time.Second)
	if got := c.MasterOf("k0"); got == m || len(c.Masters()) != 3 {
		t.Fatalf("after killing %v: master of k0 is %v, %d masters", m, got, len(c.Masters()))
	}
	// A client that knew the old master keeps dialing it until it reloads the slot map
	// (go-redis reloads on MOVED, not on a refused dial): ask a new one.
	if v, err := c.Client().Get(ctx, "k0").Result(); err != nil || v != "0" {
		t.Fatalf("k0 after the failover: %q, %v", v, err)
	}
}
