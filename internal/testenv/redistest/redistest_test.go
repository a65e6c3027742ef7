package redistest

import (
	"syscall"
	"testing"
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
