package redistest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by one test.
type Server struct {
	t     testing.TB
	bin   string
	dir   string
	port  int
	extra []string
	tls   *TLSFiles // nil: plain TCP
	pass  string    // the --requirepass flag's value

	mu   sync.Mutex // guards cmd and done (Close may run from cleanup while a test kills)
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts a server with extra redis-server flags, or skips the test if redis-server
// is not installed. The test's cleanup kills it.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, nil, extra)
}

// StartTLS starts a server that accepts only TLS on its port, with the server certificate
// of files; clients must present a certificate its CA signed (redis-server's default,
// tls-auth-clients yes).
func StartTLS(t testing.TB, files *TLSFiles, extra ...string) *Server {
	t.Helper()
	return start(t, files, extra)
}

func start(t testing.TB, files *TLSFiles, extra []string) *Server {
	t.Helper()
	return startWith(t, files, func() []string { return extra })
}

// startAttempts is how many ports a new server tries: a port found free can be taken
// before redis-server binds it (by another test's server, or an outgoing connection's
// ephemeral port), and the server then exits at start.
const startAttempts = 5

// startWith starts a server with the flags extra returns, again on fresh ports (and fresh
// flags: a cluster's bus port) while it exits at start.
func startWith(t testing.TB, files *TLSFiles, extra func() []string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skipf("redis-server is not installed (Debian package redis-server, `make deps`): %v", err)
	}
	for attempt := 1; ; attempt++ {
		flags := extra()
		s := &Server{t: t, bin: bin, dir: t.TempDir(), port: freePort(t), extra: flags, tls: files}
		if i := slices.Index(flags, "--requirepass"); i >= 0 && i+1 < len(flags) {
			s.pass = flags[i+1]
		}
		err := s.start()
		if err == nil {
			t.Cleanup(func() { s.Close() })
			return s
		}
		if !errors.Is(err, errExited) || attempt == startAttempts {
			t.Fatal(err)
		}
		t.Logf("%v; again on another port", err)
	}
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is a cpcache storage URL for the server with a key prefix: redis://, or rediss://
// with the CA and client certificate for a TLS server. It has no password.
func (s *Server) URL(prefix string) string {
	if s.tls != nil {
		return "rediss://" + s.Addr() + "/" + url.PathEscape(prefix) + "?" + s.tls.Query()
	}
	return "redis://" + s.Addr() + "/" + url.PathEscape(prefix)
}

// Client is a go-redis client of the server (with its password and TLS), for tests that
// look at or change what is stored. The test's cleanup closes it.
func (s *Server) Client() *redis.Client {
	s.t.Helper()
	c := s.newClient()
	s.t.Cleanup(func() { c.Close() })
	return c
}

// newClient is Client without the cleanup: the caller closes it.
func (s *Server) newClient() *redis.Client {
	s.t.Helper()
	o := &redis.Options{Addr: s.Addr(), Password: s.pass, DisableIdentity: true}
	if s.tls != nil {
		o.TLSConfig = s.tls.ClientConfig(s.t)
	}
	return redis.NewClient(o)
}

func (s *Server) String() string { return fmt.Sprintf("redis-server :%d", s.port) }

// Start starts the server process (again, after Kill: same port, empty) and waits until it
// answers; it fails the test if it exits or does not answer within 15 seconds.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// errExited: the server exited before it answered (its port taken, a bad flag).
var errExited = errors.New("exited at start")

// start is Start, returning why the server did not come up; its output is in the error.
func (s *Server) start() error {
	args := []string{"--port", strconv.Itoa(s.port)}
	if s.tls != nil {
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", s.tls.ServerCert,
			"--tls-key-file", s.tls.ServerKey, "--tls-ca-cert-file", s.tls.CA}
	}
	args = append(append(args, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--loglevel", "warning"), s.extra...)
	cmd := exec.Command(s.bin, args...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server on port %d: %w", s.port, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := s.ping()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redistest: redis-server on port %d %w: %s", s.port, errExited, bytes.TrimSpace(out.Bytes()))
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redistest: redis-server on port %d did not answer: %v", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockedBuffer is a redis-server's output: written by exec's copying goroutine, read by
// start.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil // enough to say why it stopped
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

// ping sends an inline PING and reads one reply line (+PONG, or an error such as NOAUTH).
func (s *Server) ping() error {
	line, err := s.inline("PING")
	if err != nil {
		return err
	}
	if len(line) == 0 || (line[0] != '+' && line[0] != '-') {
		return fmt.Errorf("redistest: unexpected PING reply %q", line)
	}
	return nil
}

// DBSize is the number of keys the server holds (its DBSIZE reply).
func (s *Server) DBSize() (int, error) {
	line, err := s.inline("DBSIZE")
	if err != nil {
		return 0, err
	}
	if len(line) < 3 || line[0] != ':' {
		return 0, fmt.Errorf("redistest: unexpected DBSIZE reply %q", line)
	}
	return strconv.Atoi(line[1 : len(line)-2])
}

// inline sends cmd as an inline command on a new connection (TLS for a TLS server) and
// returns the first line of the reply.
func (s *Server) inline(cmd string) (string, error) {
	var c net.Conn
	var err error
	if s.tls != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.Addr(), s.tls.ClientConfig(s.t))
	} else {
		c, err = net.DialTimeout("tcp", s.Addr(), time.Second)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

// Kill stops the server abruptly (SIGKILL) and waits for it to exit. A no-op when it is
// not running.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Signal sends sig to the running server (SIGSTOP stalls it, SIGCONT resumes it).
func (s *Server) Signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.t.Fatalf("redistest: signal %v: redis-server on port %d is not running", sig, s.port)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v to redis-server on port %d: %v", sig, s.port, err)
	}
}

// Close kills the server; nil-safe and idempotent.
func (s *Server) Close() error {
	if s != nil {
		s.Kill()
	}
	return nil
}
