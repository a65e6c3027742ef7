package zmq

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func newCtx(t *testing.T) *Context {
	t.Helper()
	c, err := NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func newSocket(t *testing.T, c *Context, typ Type) *Socket {
	t.Helper()
	s, err := c.Socket(typ)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// recvWithin polls s for up to d and receives one message.
func recvWithin(t *testing.T, s *Socket, d time.Duration) [][]byte {
	t.Helper()
	items := []PollItem{{Socket: s, Events: PollIn}}
	if n, err := Poll(items, int(d/time.Millisecond)); err != nil || n != 1 {
		t.Fatalf("poll: %d ready, %v", n, err)
	}
	msg, dropped, err := s.Recv(DontWait, 8)
	if err != nil || dropped != 0 {
		t.Fatalf("recv: %v (%d frames dropped)", err, dropped)
	}
	return msg
}

// TestPubSubOverTCP: a multipart message (an empty frame included) crosses a bound PUB and
// a connected SUB intact; the bound port 0 is resolved by LastEndpoint.
func TestPubSubOverTCP(t *testing.T) {
	c := newCtx(t)
	pub, sub := newSocket(t, c, PUB), newSocket(t, c, SUB)
	if err := pub.SetInt(MaxMsgSize, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := pub.Bind("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ep, err := pub.GetString(LastEndpoint)
	if err != nil || !strings.HasPrefix(ep, "tcp://127.0.0.1:") || strings.HasSuffix(ep, ":0") {
		t.Fatalf("LastEndpoint %q, %v", ep, err)
	}
	if err := sub.SetBytes(Subscribe, nil); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	items := []PollItem{{Socket: sub, Events: PollIn}}
	for i := 0; ; i++ { // a subscription takes effect once the connection is up
		if i == 500 {
			t.Fatal("the subscriber got nothing in 5s")
		}
		if err := pub.Send(DontWait, []byte("topic"), nil, []byte("payload")); err != nil {
			t.Fatal(err)
		}
		if n, _ := Poll(items, 10); n == 1 {
			break
		}
	}
	msg, _, err := sub.Recv(0, 8)
	if err != nil || len(msg) != 3 || string(msg[0]) != "topic" || len(msg[1]) != 0 || string(msg[2]) != "payload" {
		t.Fatalf("got %q, %v", msg, err)
	}
	// Recv keeps at most maxFrames frames and reads the rest.
	for { // drain
		if _, _, err := sub.Recv(DontWait, 8); err != nil {
			break
		}
	}
	if err := pub.Send(0, []byte("a"), []byte("b"), []byte("c")); err != nil {
		t.Fatal(err)
	}
	got, dropped, err := sub.Recv(0, 1)
	if err != nil || len(got) != 1 || dropped != 2 {
		t.Fatalf("Recv(maxFrames 1) = %q, %d dropped, %v", got, dropped, err)
	}
}

// TestRouterMandatory: a ROUTER with RouterMandatory refuses a message to an unknown peer
// with EHOSTUNREACH, without blocking, and answers a known one.
func TestRouterMandatory(t *testing.T) {
	c := newCtx(t)
	router, dealer := newSocket(t, c, ROUTER), newSocket(t, c, DEALER)
	if err := router.SetInt(RouterMandatory, 1); err != nil {
		t.Fatal(err)
	}
	if err := router.Bind("inproc://router-mandatory"); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Connect("inproc://router-mandatory"); err != nil {
		t.Fatal(err)
	}
	if err := router.Send(DontWait, []byte("nobody"), []byte("x")); !errors.Is(err, EHOSTUNREACH) {
		t.Fatalf("send to an unknown peer: %v, want EHOSTUNREACH", err)
	}
	if err := dealer.Send(0, nil, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	req := recvWithin(t, router, 5*time.Second)
	if len(req) != 3 || string(req[2]) != "hello" {
		t.Fatalf("request %q", req)
	}
	if err := router.Send(DontWait, req[0], nil, []byte("back")); err != nil {
		t.Fatal(err)
	}
	if rep := recvWithin(t, dealer, 5*time.Second); len(rep) != 2 || string(rep[1]) != "back" {
		t.Fatalf("reply %q", rep)
	}
}

// TestPollRefusesForever: every wait is bounded.
func TestPollRefusesForever(t *testing.T) {
	c := newCtx(t)
	s := newSocket(t, c, PAIR)
	if _, err := Poll([]PollItem{{Socket: s, Events: PollIn}}, -1); err == nil {
		t.Fatal("Poll with no timeout was accepted")
	}
}

// TestMissingLibraryNamesItAndItsPackage: without libzmq, Open (in a child process, since
// this one has it loaded) fails with a *LoadError naming libzmq.so.5, the Debian package,
// the variable and what it tried.
func TestMissingLibraryNamesItAndItsPackage(t *testing.T) {
	if os.Getenv("CPCACHE_ZMQ_TEST_CHILD") == "1" {
		_, err := Open()
		var le *LoadError
		if !errors.As(err, &le) || !errors.Is(err, ErrLibraryNotFound) {
			t.Fatalf("Open: %v, want a *LoadError wrapping ErrLibraryNotFound", err)
		}
		os.Stdout.WriteString("ERR: " + err.Error() + "\n")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestMissingLibraryNamesItAndItsPackage$", "-test.v")
	cmd.Env = append(os.Environ(), "CPCACHE_ZMQ_TEST_CHILD=1", Env+"=/nonexistent/libzmq.so.5")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, want := range []string{"zmq: cannot load libzmq.so.5", "install Debian's libzmq5", Env, "/nonexistent/libzmq.so.5"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the error lacks %q:\n%s", want, out)
		}
	}
}

// TestMaxMsgSizeDropsTheConnection: a raw ZMTP 3 peer of a socket with MaxMsgSize whose
// frame header declares more (2^62 bytes, or the bound plus one) is disconnected; libzmq
// allocates nothing of that size and the socket serves on.
func TestMaxMsgSizeDropsTheConnection(t *testing.T) {
	for _, size := range []uint64{1 << 62, 1025} {
		c := newCtx(t)
		pub := newSocket(t, c, PUB)
		if err := pub.SetInt(MaxMsgSize, 1024); err != nil {
			t.Fatal(err)
		}
		if err := pub.Bind("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		ep, _ := pub.GetString(LastEndpoint)
		conn, err := net.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		greeting := make([]byte, 64)
		greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
		copy(greeting[12:], "NULL")
		ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB")
		msg := append(append(greeting, 0x04, byte(len(ready))), ready...)
		msg = binary.BigEndian.AppendUint64(append(msg, 0x02), size)
		if _, err := conn.Write(msg); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Fatalf("frame of %d bytes: the connection stayed open: %v", size, err)
		}
	}
}

// benchPair is a connected PAIR over inproc for the round-trip benchmarks.
func benchPair(b *testing.B, name string) (*Socket, *Socket) {
	c, err := NewContext()
	if err != nil {
		b.Fatal(err)
	}
	a, err := c.Socket(PAIR)
	if err != nil {
		b.Fatal(err)
	}
	z, err := c.Socket(PAIR)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close(); z.Close(); c.Close() })
	if err := a.Bind("inproc://" + name); err != nil {
		b.Fatal(err)
	}
	if err := z.Connect("inproc://" + name); err != nil {
		b.Fatal(err)
	}
	return a, z
}

// BenchmarkSendRecvInproc is one Send and one Recv of a message over inproc: the cost of the
// binding's calls into libzmq (the per-call overhead plus libzmq's own work).
func BenchmarkSendRecvInproc(b *testing.B) {
	for _, bc := range []struct {
		name   string
		frames [][]byte
	}{
		{"1x64B", [][]byte{make([]byte, 64)}},
		{"3frames", [][]byte{[]byte("kv-events"), make([]byte, 8), make([]byte, 1024)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			a, z := benchPair(b, "bench-"+bc.name)
			b.ReportAllocs()
			for b.Loop() {
				if err := a.Send(0, bc.frames...); err != nil {
					b.Fatal(err)
				}
				if got, _, err := z.Recv(0, 8); err != nil || len(got) != len(bc.frames) {
					b.Fatalf("recv %d frames, %v", len(got), err)
				}
			}
		})
	}
}
