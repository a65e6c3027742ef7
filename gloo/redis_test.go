package gloo_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/internal/testenv/redistest"
)

// startRedis starts a private redis-server on addr:port, its command line prefixed by wrap
// (to run it in a network namespace, where internal/redistest's loopback server cannot
// serve), and returns the port. It is killed at the end of the test.
func startRedis(t *testing.T, addr string, port int, wrap []string) int {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make deps installs it): ", err)
	}
	dir := t.TempDir()
	argv := append(append([]string(nil), wrap...), bin, "--bind", addr, "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ping := exec.Command("sh", "-c", fmt.Sprintf("exec %s redis-cli -h %s -p %d ping", shellJoin(wrap), addr, port))
		out, err := ping.CombinedOutput()
		if err == nil && string(out) == "PONG\n" {
			return port
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server on %s:%d did not answer within 10s (%v: %s); log:\n%s", addr, port, err, out, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func shellJoin(argv []string) string {
	s := ""
	for _, a := range argv {
		s += strconv.Quote(a) + " "
	}
	return s
}

// freePort returns a TCP port that was free on addr a moment ago.
func freePort(t *testing.T, addr string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestRedisStore runs the suite twice against one real redis-server: Gloo's RedisStore
// refuses to overwrite keys (SETNX), so the second run passes only with fresh run ids.
func TestRedisStore(t *testing.T) {
	srv := redistest.Start(t)
	for run := 0; run < 2; run++ {
		multiproc.Run(t, multiproc.Spec{Role: "conformance", N: 4, Timeout: time.Minute,
			Env: []string{"CPCACHE_STORE=" + srv.URL("redistest"), "CPCACHE_TEST_SOAK=8"}})
	}
}
