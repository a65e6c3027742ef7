package hicache

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// redisServer is a real redis-server on a free loopback port without persistence, owned by
// one test (started again on the same port after a kill, it is empty).
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts a server, or skips the test if redis-server is not installed.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skipf("redis-server is not installed (Debian package redis-server, `make deps`): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &redisServer{t: t, bin: bin, dir: t.TempDir(), port: port}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.dir, "--daemonize", "no", "--loglevel", "warning")
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(r.cmd, r.done)
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-r.done:
			r.t.Fatalf("redis-server on port %d exited at start", r.port)
		default:
		}
		if time.Now().After(deadline) {
			r.kill()
			r.t.Fatalf("redis-server on port %d did not answer: %v", r.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the server abruptly (SIGKILL) and waits for it to exit.
func (r *redisServer) kill() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}
