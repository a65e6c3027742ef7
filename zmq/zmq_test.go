package zmq

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
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
	msg, dropped, err := s.Recv(DontWait, 16)
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

// TestMissingSymbolsFailAtLoad: a library that opens but lacks libzmq's entry points (libc
// here) fails Open with ErrMissingSymbol naming every missing one, before any socket exists.
func TestMissingSymbolsFailAtLoad(t *testing.T) {
	if os.Getenv("CPCACHE_ZMQ_TEST_CHILD") == "1" {
		_, err := Open()
		var le *LoadError
		if !errors.As(err, &le) || !errors.Is(err, ErrMissingSymbol) {
			t.Fatalf("Open: %v, want a *LoadError wrapping ErrMissingSymbol", err)
		}
		if _, err := NewContext(); !errors.Is(err, ErrMissingSymbol) {
			t.Fatalf("NewContext: %v, want ErrMissingSymbol", err)
		}
		os.Stdout.WriteString("ERR: " + err.Error() + "\n")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestMissingSymbolsFailAtLoad$", "-test.v")
	cmd.Env = append(os.Environ(), "CPCACHE_ZMQ_TEST_CHILD=1", Env+"=libc.so.6")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, want := range []string{"zmq: cannot load libzmq.so.5", "libc.so.6: missing symbols", "zmq_ctx_new (since ZMQ 4.0)",
		"zmq_msg_recv (since ZMQ 4.0)", "zmq_socket_monitor (since ZMQ 4.0)"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the error lacks %q:\n%s", want, out)
		}
	}
}

// TestPollReportsEachItem: with three sockets polled, Ready lands on the one with a message
// and on no other (zmq_pollitem_t's layout: a wrong size or offset reads another item's
// revents or misses the ready one).
func TestPollReportsEachItem(t *testing.T) {
	c := newCtx(t)
	var recv [3]*Socket
	var send [3]*Socket
	for i := range recv {
		recv[i], send[i] = newSocket(t, c, PAIR), newSocket(t, c, PAIR)
		ep := "inproc://poll-each-" + string(rune('a'+i))
		if err := recv[i].Bind(ep); err != nil {
			t.Fatal(err)
		}
		if err := send[i].Connect(ep); err != nil {
			t.Fatal(err)
		}
	}
	for ready := range recv {
		if err := send[ready].Send(0, []byte("x")); err != nil {
			t.Fatal(err)
		}
		items := []PollItem{{Socket: recv[0], Events: PollIn}, {Socket: recv[1], Events: PollIn}, {Socket: recv[2], Events: PollIn}}
		n, err := Poll(items, 5000)
		if err != nil || n != 1 {
			t.Fatalf("message on %d: poll %d ready, %v", ready, n, err)
		}
		for i, it := range items {
			if want := map[bool]int{true: PollIn}[i == ready]; it.Ready != want {
				t.Fatalf("message on %d: item %d Ready %d, want %d", ready, i, it.Ready, want)
			}
		}
		if msg, _, err := recv[ready].Recv(DontWait, 8); err != nil || len(msg) != 1 || string(msg[0]) != "x" {
			t.Fatalf("recv %q, %v", msg, err)
		}
	}
}

// TestEndpointWithNULIsRefused: C would read an endpoint up to its first NUL and bind another
// name than the one asked; the call fails naming the endpoint.
func TestEndpointWithNULIsRefused(t *testing.T) {
	c := newCtx(t)
	s := newSocket(t, c, PAIR)
	for _, f := range []func(string) error{s.Bind, s.Connect, func(ep string) error { return s.Monitor(ep, EventAll) }} {
		if err := f("inproc://a\x00b"); err == nil || !strings.Contains(err.Error(), `"inproc://a\x00b"`) {
			t.Fatalf("endpoint with a NUL: %v, want an error naming it", err)
		}
	}
}

// TestErrnoMessages: libzmq's errors read as zmq_strerror says, ETERM included.
func TestErrnoMessages(t *testing.T) {
	if _, err := Open(); err != nil {
		t.Fatal(err)
	}
	if got := ETERM.Error(); got != "Context was terminated" {
		t.Fatalf("ETERM reads %q", got)
	}
	if got := EAGAIN.Error(); got != "Resource temporarily unavailable" {
		t.Fatalf("EAGAIN reads %q", got)
	}
	c := newCtx(t)
	s := newSocket(t, c, PAIR)
	if _, _, err := s.Recv(DontWait, 1); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("Recv on an empty socket: %v, want EAGAIN", err)
	}
	if err := s.Bind("nosuchtransport://x"); !errors.Is(err, syscall.EPROTONOSUPPORT) {
		t.Fatalf("bind on an unknown transport: %v, want EPROTONOSUPPORT", err)
	}
}

// TestFramesOfEverySizeArriveIntact: frames stored inside the message (up to 33 bytes in
// libzmq 4.x) and outside it (up to 1 MiB) come back byte for byte, empty ones included.
func TestFramesOfEverySizeArriveIntact(t *testing.T) {
	c := newCtx(t)
	a, z := newSocket(t, c, PAIR), newSocket(t, c, PAIR)
	if err := a.Bind("inproc://sizes"); err != nil {
		t.Fatal(err)
	}
	if err := z.Connect("inproc://sizes"); err != nil {
		t.Fatal(err)
	}
	var sent [][]byte
	for i, n := range []int{0, 1, 32, 33, 34, 1000, 1 << 20, 0} {
		f := make([]byte, n)
		for j := range f {
			f[j] = byte(i*31 + j*7)
		}
		sent = append(sent, f)
	}
	if err := a.Send(0, sent...); err != nil {
		t.Fatal(err)
	}
	got := recvWithin(t, z, 5*time.Second)
	if len(got) != len(sent) {
		t.Fatalf("%d frames, sent %d", len(got), len(sent))
	}
	for i := range sent {
		if string(got[i]) != string(sent[i]) {
			t.Fatalf("frame %d (%d bytes) came back as %d other bytes", i, len(sent[i]), len(got[i]))
		}
	}
}

// BenchmarkVersion is one call into libzmq with three pointer arguments (zmq_version): the
// binding's fixed cost per call.
func BenchmarkVersion(b *testing.B) {
	if _, err := Open(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if major, _, _, err := Version(); err != nil || major < 4 {
			b.Fatal(major, err)
		}
	}
}

// TestGetInt: an int option reads back as set; Events of a PUB socket (never blocks) says
// PollOut and of a SUB with nothing queued not PollIn; a closed socket is an error.
func TestGetInt(t *testing.T) {
	c := newCtx(t)
	pub, sub := newSocket(t, c, PUB), newSocket(t, c, SUB)
	if err := pub.SetInt(SndHWM, 7); err != nil {
		t.Fatal(err)
	}
	if v, err := pub.GetInt(SndHWM); err != nil || v != 7 {
		t.Fatalf("SndHWM %d, %v; want 7", v, err)
	}
	if ev, err := pub.GetInt(Events); err != nil || ev&PollOut == 0 {
		t.Fatalf("PUB Events %#x, %v; want PollOut", ev, err)
	}
	if ev, err := sub.GetInt(Events); err != nil || ev&PollIn != 0 {
		t.Fatalf("SUB Events %#x, %v; want no PollIn", ev, err)
	}
	sub.Close()
	if _, err := sub.GetInt(Events); err == nil {
		t.Fatal("GetInt on a closed socket: no error")
	}
}
