package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// stream is a peer's ZMTP 3 bytes: the greeting, then frames [flags, body].
func stream(frames ...[]byte) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	out := g
	for _, f := range frames {
		flags, body := f[0], f[1:]
		if len(body) > 255 {
			out = binary.BigEndian.AppendUint64(append(out, flags|0x02), uint64(len(body)))
		} else {
			out = append(out, flags, byte(len(body)))
		}
		out = append(out, body...)
	}
	return out
}

// TestZMTPChecker: the guard's reader passes valid streams whole, however they are split,
// and stops at the first byte of the first frame that breaks a bound.
func TestZMTPChecker(t *testing.T) {
	ready := append([]byte{0x04}, "\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB"...)
	more := func(n int) []byte { return append([]byte{0x01}, make([]byte, n)...) }
	last := func(n int) []byte { return append([]byte{0x00}, make([]byte, n)...) }
	for _, tc := range []struct {
		name string
		in   []byte
		ok   int    // bytes passed (-1: all)
		want string // the violation ("": none)
	}{
		{"subscribe", stream(ready, []byte{0x00, 0x01}), -1, ""},
		{"request", stream(ready, more(0), last(8)), -1, ""},
		{"4 frames", stream(ready, more(1), more(1), more(1), last(1)), -1, ""},
		{"5 frames", stream(ready, more(1), more(1), more(1), more(1), last(1)), len(stream(ready, more(1), more(1), more(1), more(1))), "more than 4 frames"},
		{"big frame", stream(ready, last(64<<10+1)), len(stream(ready)), "a frame of 65537 bytes"},
		{"big message", stream(ready, more(40<<10), last(40<<10)), len(stream(ready, more(40<<10))), "a frame of 40960 bytes"},
		{"huge header", append(stream(ready), binary.BigEndian.AppendUint64([]byte{0x02}, 1<<62)...), len(stream(ready)), "a frame of 4611686018427387904 bytes"},
		{"command with more", stream(ready, []byte{0x05, 1}), len(stream(ready)), "frame flags 0x5"},
		{"reserved flag", stream(ready, []byte{0x08, 1}), len(stream(ready)), "frame flags 0x8"},
		{"ZMTP 2", append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 1}, make([]byte, 60)...), 10, "ZMTP 1.x"},
		{"not ZMTP", []byte("GET / HTTP/1.1\r\n"), 0, "not a ZMTP greeting"},
	} {
		for _, step := range []int{1, 7, 1 << 20} {
			ck := &zmtpChecker{maxBytes: DefaultMaxMessageBytes, maxFrames: maxFrames}
			passed, in := 0, tc.in
			var err error
			for len(in) > 0 && err == nil {
				n := min(step, len(in))
				var ok int
				ok, err = ck.feed(in[:n])
				passed += ok
				in = in[n:]
			}
			want := tc.ok
			if want < 0 {
				want = len(tc.in)
			}
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%s (step %d): %v, want %q", tc.name, step, err, tc.want)
			}
			// Split reads may have passed the bad frame's header (at most 9 bytes, no body):
			// libzmq then sees the connection close.
			if step == 1<<20 && passed != want || passed < want || passed > want+9 {
				t.Errorf("%s (step %d): passed %d bytes, want %d", tc.name, step, passed, want)
			}
		}
	}
}

// flakyListener fails its first fails Accepts as a process out of file descriptors does.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestGuardAcceptsAfterAcceptErrors: an Accept that fails (EMFILE while a flood of peers
// holds every descriptor) does not end the guard: the next peer is still joined to libzmq's
// side.
func TestGuardAcceptsAfterAcceptErrors(t *testing.T) {
	private := filepath.Join(t.TempDir(), "private")
	inner, err := net.Listen("unix", private)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &flakyListener{Listener: pub}
	ln.fails.Store(3)
	var cut atomic.Uint64
	g := startGuard(ln, private, 1<<16, &cut, nil, time.Second)
	defer g.close()

	joined := make(chan error, 1)
	go func() {
		c, err := inner.Accept()
		if err == nil {
			c.Close()
		}
		joined <- err
	}()
	peer, err := net.Dial("tcp", pub.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	select {
	case err := <-joined:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("after 3 failed Accepts the guard joined no peer to libzmq's side in 10 s")
	}
}

// TestGuardHoldsAtMostMaxPeers: a guard holds maxPeers connections (ipc), and at most
// maxPeersPerHost from one IP address (TCP); one more is closed at once and counted as cut,
// and one is taken again once a held one leaves.
func TestGuardHoldsAtMostMaxPeers(t *testing.T) {
	for _, tc := range []struct {
		network string
		cap     int
	}{{"unix", maxPeers}, {"tcp", maxPeersPerHost}} {
		t.Run(tc.network, func(t *testing.T) {
			dir := shortDir(t)
			private := filepath.Join(dir, "private")
			inner, err := net.Listen("unix", private)
			if err != nil {
				t.Fatal(err)
			}
			defer inner.Close()
			go func() { // libzmq's side: takes every connection and holds it
				for {
					c, err := inner.Accept()
					if err != nil {
						return
					}
					defer c.Close()
				}
			}()
			addr := "127.0.0.1:0"
			if tc.network == "unix" {
				addr = filepath.Join(dir, "public")
			}
			pub, err := net.Listen(tc.network, addr)
			if err != nil {
				t.Fatal(err)
			}
			var cut atomic.Uint64
			g := startGuard(pub, private, 1<<16, &cut, nil, time.Second)
			defer g.close()
			dial := func() net.Conn {
				c, err := net.Dial(tc.network, pub.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			held := make([]net.Conn, tc.cap)
			for i := range held {
				held[i] = dial()
				defer held[i].Close()
			}
			// closedSoon reports whether the guard closed c within a few seconds.
			closedSoon := func(c net.Conn) bool {
				c.SetReadDeadline(time.Now().Add(3 * time.Second))
				_, err := c.Read(make([]byte, 1))
				return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
			}
			extra := dial()
			defer extra.Close()
			if !closedSoon(extra) {
				t.Fatalf("connection %d of a guard that holds %d was not closed", tc.cap+1, tc.cap)
			}
			if got := cut.Load(); got != 1 {
				t.Fatalf("cut = %d, want 1 (the connection over the cap)", got)
			}
			held[0].Close()
			deadline := time.Now().Add(10 * time.Second)
			for {
				again := dial()
				ok := !closedSoon(again)
				again.Close()
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no connection taken in 10 s after a held one left")
				}
			}
		})
	}
}

// TestSubscriptionBudget: a PUB peer may hold maxSubscriptions subscriptions (libzmq keeps
// each in a trie, about 32 bytes per byte of topic, for as long as the connection lasts): one
// more, as a ZMTP 3.0 message or a ZMTP 3.1 SUBSCRIBE command, or a frame over
// maxSubscriptionBytes after the handshake, closes the connection, counted; a subscriber
// beside it keeps getting batches.
func TestSubscriptionBudget(t *testing.T) {
	topic := func(i int) []byte { return []byte(fmt.Sprintf("topic-%04d", i)) }
	for name, sub := range map[string]func(i int) []byte{
		"message": func(i int) []byte { return append([]byte{0x00, 0x01}, topic(i)...) },
		"command": func(i int) []byte { return append([]byte{0x04, 9}, append([]byte("SUBSCRIBE"), topic(i)...)...) },
	} {
		t.Run(name, func(t *testing.T) {
			ep := "ipc://" + filepath.Join(shortDir(t), "pub")
			src := newStreamSource()
			p, err := Start(src, Options{Endpoint: ep, Linger: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			healthy := dialZMTP(t, ep, "SUB", true)
			healthy.subscribe(t)
			got := countMessages(healthy)
			defer feedEveryMillisecond(src)()

			peer := dialZMTP(t, ep, "SUB", true)
			for i := range maxSubscriptions {
				peer.send(t, sub(i))
			}
			if peer.closedWithin(500 * time.Millisecond) {
				t.Fatalf("a peer with %d subscriptions was closed", maxSubscriptions)
			}
			peer.send(t, sub(maxSubscriptions))
			if !peer.closedWithin(10 * time.Second) {
				t.Fatalf("a peer with %d subscriptions was kept", maxSubscriptions+1)
			}
			long := dialZMTP(t, ep, "SUB", true)
			long.send(t, append([]byte{0x00, 0x01}, make([]byte, maxSubscriptionBytes)...))
			if !long.closedWithin(10 * time.Second) {
				t.Fatalf("a peer that sent a %d-byte frame after its handshake was kept", maxSubscriptionBytes+1)
			}
			if c := p.Stats().Cut; c != 2 {
				t.Fatalf("Cut = %d, want 2", c)
			}
			before := got.Load()
			if !waitFor(10*time.Second, func() bool { return got.Load() >= before+20 }) {
				t.Fatalf("the healthy subscriber got %d batches after the cuts, want 20 more", got.Load()-before)
			}
		})
	}
}

// TestHandshakeTimeout: a peer that connects and sends nothing, or only part of its
// greeting, is closed after handshakeTimeout and counted; one that finished its handshake
// is kept however long it stays quiet.
func TestHandshakeTimeout(t *testing.T) {
	defer func(d time.Duration) { handshakeTimeout = d }(handshakeTimeout)
	handshakeTimeout = 300 * time.Millisecond
	ep := "ipc://" + filepath.Join(shortDir(t), "pub")
	p, err := Start(newStreamSource(), Options{Endpoint: ep, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	done := dialZMTP(t, ep, "SUB", true)
	done.subscribe(t)
	silent := dialZMTP(t, ep, "SUB", false) // the greeting only: no READY
	if !silent.closedWithin(10 * time.Second) {
		t.Fatal("a peer that never sent READY was kept")
	}
	if done.closedWithin(3 * handshakeTimeout) {
		t.Fatal("a subscriber that finished its handshake was closed for being quiet")
	}
	if c := p.Stats().Cut; c != 1 {
		t.Fatalf("Cut = %d, want 1", c)
	}
}
