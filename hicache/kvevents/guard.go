package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A guard stands in front of a bound libzmq socket: it listens on the public endpoint
// (tcp:// or ipc://) and joins each connection to the socket's private ipc:// endpoint,
// reading what the peer sends as the ZMTP 3 stream it must be (greeting, then frames) and
// cutting the connection at the first frame over the size bound, or message of more than
// maxFrames frames or more than the bound in all, before a byte of it reaches libzmq.
// libzmq bounds each frame (ZMQ_MAXMSGSIZE) but holds every frame of a multipart message
// until its last one: a peer sending an endless message would grow the rank's memory as
// fast as it sends. What libzmq sends toward the peer passes unchanged: for a PUB socket
// through an outQueue per connection (out set), which reads libzmq at once and drops whole
// messages, counted, for a peer whose queue is full; for the replay ROUTER as is, so that
// a client that does not read fills its own connection and libzmq's queue (ReplayHWM),
// which the replay loop sees (EAGAIN); one whose connection takes nothing for
// ReplayTimeout is closed, which frees what libzmq queued for it.
type guard struct {
	ln        net.Listener
	private   string // the libzmq socket's path
	maxBytes  uint64
	maxFrames int
	cut       *atomic.Uint64
	out       *outConfig    // per-subscriber queues; nil: copied as is
	stall     time.Duration // without out: a write to the peer blocked this long closes it

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	queues map[*outQueue]queueName // the subscribers' queues
	nconns uint64                  // connections numbered so far
	peers  int                     // peers admitted and not gone
	hosts  map[string]int          // of those, the TCP peers per IP address
	closed bool
	wg     sync.WaitGroup
}

// outConfig bounds each subscriber's outQueue.
type outConfig struct {
	maxBytes int64
	maxMsgs  int
	totals   *subscriberTotals
	pool     *msgPool
}

// maxFrames is the most frames a peer's message may have: a subscription has 1, a replay
// request 2 ([empty, seq]).
const maxFrames = 4

// maxPeers is the most connections a guard holds at once; one more is closed at once
// (counted with the cut ones). Each costs two goroutines (three on a PUB socket) and
// 32 KiB, plus, on a PUB socket, a 32 KiB read buffer, the buffer of the batch being read
// (kept up to 256 KiB) and its queue (at most Options.SubscriberQueueBytes, equal batches
// shared among queues), and libzmq's queues (kept short by the outQueue's reader).
const maxPeers = 256 // a replica has a few routers; 256 subscribers stuck at different times pin about 1.1 GiB

// maxPeersPerHost is the most TCP connections a guard holds from one IP address, so that
// one host cannot take every place and keep other subscribers out.
const maxPeersPerHost = 32

// listenPublic listens on a bound tcp:// or ipc:// endpoint (checked by CheckEndpoint).
func listenPublic(ep string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			os.Remove(path) // a stale socket, as libzmq's bind does
		}
		return net.Listen("unix", path)
	}
	addr := strings.TrimPrefix(ep, "tcp://")
	if strings.HasPrefix(addr, "*:") {
		addr = addr[1:]
	}
	return net.Listen("tcp", addr)
}

// publicEndpoint is what a peer connects to: ep with a port 0 resolved.
func publicEndpoint(ep string, ln net.Listener) string {
	if strings.HasPrefix(ep, "tcp://") {
		i := strings.LastIndex(ep, ":")
		return fmt.Sprintf("%s:%d", ep[:i], ln.Addr().(*net.TCPAddr).Port)
	}
	return ep
}

func startGuard(ln net.Listener, private string, maxBytes int64, cut *atomic.Uint64, out *outConfig, stall time.Duration) *guard {
	g := &guard{ln: ln, private: private, maxBytes: uint64(maxBytes), maxFrames: maxFrames, cut: cut, out: out, stall: stall,
		conns: map[net.Conn]struct{}{}, queues: map[*outQueue]queueName{}, hosts: map[string]int{}}
	g.wg.Add(1)
	go g.accept()
	return g
}

// admit takes a new peer unless the guard holds maxPeers already, or maxPeersPerHost from
// the peer's IP address (TCP; ipc peers share the machine's user, whose directory holds the
// socket); leave gives its place back.
func (g *guard) admit(peer net.Conn) (leave func(), ok bool) {
	host := ""
	if a, isTCP := peer.RemoteAddr().(*net.TCPAddr); isTCP {
		host = a.IP.String()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers >= maxPeers || host != "" && g.hosts[host] >= maxPeersPerHost {
		return nil, false
	}
	g.peers++
	if host != "" {
		g.hosts[host]++
	}
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.peers--
		if host != "" {
			if g.hosts[host]--; g.hosts[host] == 0 {
				delete(g.hosts, host)
			}
		}
	}, true
}

func (g *guard) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		c.Close()
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *guard) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
	c.Close()
}

func (g *guard) accept() {
	defer g.wg.Done()
	var backoff time.Duration
	for {
		peer, err := g.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Anything else (EMFILE or ENFILE while a flood of peers holds every file
			// descriptor, ECONNABORTED) passes: the guard waits a little and accepts again,
			// so that a peer that exhausts descriptors for a while cannot end the socket.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		leave, ok := g.admit(peer)
		if !ok {
			g.cut.Add(1)
			peer.Close()
			continue
		}
		inner, err := net.Dial("unix", g.private)
		if err != nil {
			leave()
			peer.Close()
			continue
		}
		if !g.track(peer) || !g.track(inner) {
			leave()
			peer.Close()
			inner.Close()
			continue
		}
		var q *outQueue
		if g.out != nil {
			q = newOutQueue(g.out.maxBytes, g.out.maxMsgs, g.out.totals, g.out.pool)
			if !g.trackQueue(q, peer.RemoteAddr().String()) {
				leave()
				g.untrack(peer)
				g.untrack(inner)
				continue
			}
		}
		var once sync.Once
		end := func() {
			once.Do(leave)
			g.untrack(peer)
			g.untrack(inner)
			if q != nil {
				g.untrackQueue(q)
			}
		}
		if q == nil {
			g.wg.Add(1)
			go func() { // libzmq → peer, as is
				defer g.wg.Done()
				_ = copyStalling(peer, inner, g.stall)
				end()
			}()
		} else {
			g.wg.Add(2)
			go func() { // libzmq → queue, at once
				defer g.wg.Done()
				_ = q.read(inner)
				end()
			}()
			go func() { // queue → peer
				defer g.wg.Done()
				_ = q.write(peer)
				end()
			}()
		}
		g.wg.Add(1)
		go func() { // peer → libzmq, checked
			defer g.wg.Done()
			var bad *zmtpError
			if err := g.forward(inner, peer); errors.As(err, &bad) {
				g.cut.Add(1)
			}
			end()
		}()
	}
}

// queueName names a subscriber's queue: its connection's number and peer address.
type queueName struct {
	conn   uint64
	remote string
}

func (g *guard) trackQueue(q *outQueue, remote string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.nconns++
	g.queues[q] = queueName{g.nconns, remote}
	return true
}

// untrackQueue closes q (its writer ends, its bytes are uncounted) and forgets it.
func (g *guard) untrackQueue(q *outQueue) {
	q.close()
	g.mu.Lock()
	delete(g.queues, q)
	g.mu.Unlock()
}

// subscribers lists the queues' stats.
func (g *guard) subscribers() []SubscriberStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]SubscriberStats, 0, len(g.queues))
	for q, name := range g.queues {
		out = append(out, q.stats(name.conn, name.remote))
	}
	return out
}

// copyStalling copies src to dst until either ends or a write to dst stays blocked for
// stall (a peer that reads nothing; 0: no bound).
func copyStalling(dst net.Conn, src io.Reader, stall time.Duration) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if stall > 0 {
				_ = dst.SetWriteDeadline(time.Now().Add(stall))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err
		}
	}
}

// close stops accepting and closes every connection.
func (g *guard) close() {
	g.mu.Lock()
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	queues := make([]*outQueue, 0, len(g.queues))
	for q := range g.queues {
		queues = append(queues, q)
	}
	g.mu.Unlock()
	for _, q := range queues {
		q.close()
	}
	g.ln.Close()
	g.wg.Wait()
}

// zmtpError: the peer broke ZMTP or a bound.
type zmtpError struct{ what string }

func (e *zmtpError) Error() string { return "kvevents: peer cut: " + e.what }

// forward copies what the peer sends to libzmq up to the first byte that breaks a bound
// (a *zmtpError) or the end of either connection.
//
// The peer has handshakeTimeout to send its greeting and READY: a connection that never
// finishes the handshake would otherwise hold one of the guard's maxPeers for good.
func (g *guard) forward(dst io.Writer, src net.Conn) error {
	ck := &zmtpChecker{maxBytes: g.maxBytes, maxFrames: g.maxFrames}
	if g.out != nil { // the PUB socket: its peers send subscriptions only
		ck.maxSubs, ck.maxSubBytes = maxSubscriptions, maxSubscriptionBytes
	}
	if err := src.SetReadDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return err
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			shaken := ck.handshaken()
			ok, bad := ck.feed(buf[:n])
			if ok > 0 {
				if _, werr := dst.Write(buf[:ok]); werr != nil {
					return werr
				}
			}
			if bad != nil {
				return bad
			}
			if !shaken && ck.handshaken() {
				if err := src.SetReadDeadline(time.Time{}); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return &zmtpError{fmt.Sprintf("no ZMTP handshake within %v", handshakeTimeout)}
		}
		if err != nil {
			return err
		}
	}
}

// The PUB socket's budget per connection (zmtpChecker.maxSubs).
const (
	maxSubscriptions     = 64
	maxSubscriptionBytes = 256
)

// handshakeTimeout is how long a peer has to finish its handshake (a variable for tests).
var handshakeTimeout = 10 * time.Second

// zmtpChecker follows a ZMTP 3 stream from the peer: the 64-byte greeting, then frames
// (flags: 0x01 more, 0x02 long size, 0x04 command; a 1- or 8-byte size; the body).
type zmtpChecker struct {
	maxBytes  uint64
	maxFrames int
	// On a PUB socket (maxSubs > 0): every frame after the handshake is at most
	// maxSubBytes, and at most maxSubs subscriptions and cancels (messages, or ZMTP 3.1
	// SUBSCRIBE and CANCEL commands) pass: libzmq keeps each distinct subscription in a trie
	// for as long as the connection lasts, at about 32 bytes per byte of topic, so 200,000
	// subscriptions of 250 bytes grew the rank by 1.6 GB. A subscriber sends one or a few.
	maxSubs     int
	maxSubBytes uint64
	subs        int // subscriptions and cancels so far
	commands    int // commands seen so far (the first is READY: the end of the handshake)
	name        [16]byte
	nameN       int // bytes of the command's body kept in name

	greeting int     // greeting bytes seen (64 when done)
	state    int     // stateFlags, stateSize or stateBody
	flags    byte    // of the frame being read
	size     [8]byte // its size bytes
	sizeN    int     // size bytes read
	left     uint64  // body bytes left
	frames   int     // frames of the message so far
	msgBytes uint64  // bytes of the message so far
}

const (
	stateFlags = iota
	stateSize
	stateBody
)

// feed takes bytes the peer sent; it returns how many of them keep the stream valid, and
// the violation after them, if any.
func (c *zmtpChecker) feed(b []byte) (int, error) {
	i := 0
	for i < len(b) {
		if c.greeting < 64 {
			switch x := b[i]; {
			case c.greeting == 0 && x != 0xff, c.greeting == 9 && x&0x01 == 0:
				return i, &zmtpError{"not a ZMTP greeting"}
			case c.greeting == 10 && x < 3:
				return i, &zmtpError{fmt.Sprintf("ZMTP %d.x (want 3)", x)}
			}
			c.greeting++
			i++
			continue
		}
		switch c.state {
		case stateFlags:
			c.flags = b[i]
			if c.flags&^0x07 != 0 || c.flags&0x05 == 0x05 {
				return i, &zmtpError{fmt.Sprintf("frame flags %#x", c.flags)}
			}
			c.frames++
			if c.frames > c.maxFrames {
				return i, &zmtpError{fmt.Sprintf("a message of more than %d frames", c.maxFrames)}
			}
			if c.maxSubs > 0 && c.flags&0x04 == 0 {
				if c.subs++; c.subs > c.maxSubs {
					return i, &zmtpError{fmt.Sprintf("more than %d subscriptions", c.maxSubs)}
				}
			}
			c.state, c.sizeN, c.nameN = stateSize, 0, 0
			i++
		case stateSize:
			need := 1
			if c.flags&0x02 != 0 {
				need = 8
			}
			c.size[c.sizeN] = b[i]
			c.sizeN++
			i++
			if c.sizeN < need {
				continue
			}
			size := uint64(c.size[0])
			if need == 8 {
				size = binary.BigEndian.Uint64(c.size[:])
			}
			if size > c.maxBytes || c.msgBytes+size > c.maxBytes {
				return max(0, i-need-1), &zmtpError{fmt.Sprintf("a frame of %d bytes (bound %d per message)", size, c.maxBytes)}
			}
			if c.maxSubs > 0 && c.handshaken() && size > c.maxSubBytes {
				return max(0, i-need-1), &zmtpError{fmt.Sprintf("a frame of %d bytes to a PUB socket (bound %d after the handshake)", size, c.maxSubBytes)}
			}
			c.msgBytes += size
			c.left, c.state = size, stateBody
			if size == 0 {
				if err := c.endFrame(); err != nil {
					return i, err
				}
			}
		case stateBody:
			n := uint64(len(b) - i)
			if n > c.left {
				n = c.left
			}
			if c.flags&0x04 != 0 && c.nameN < len(c.name) {
				c.nameN += copy(c.name[c.nameN:], b[i:i+int(n)])
			}
			c.left -= n
			i += int(n)
			if c.left == 0 {
				if err := c.endFrame(); err != nil {
					return i, err
				}
			}
		}
	}
	return i, nil
}

// endFrame ends the frame read; on a PUB socket a SUBSCRIBE or CANCEL command over the
// budget is the violation (it has reached libzmq, which the cut then closes at once).
func (c *zmtpChecker) endFrame() error {
	c.state = stateFlags
	if c.flags&0x01 == 0 { // the last frame of a message, or a command
		c.frames, c.msgBytes = 0, 0
	}
	if c.flags&0x04 == 0 {
		return nil
	}
	c.commands++
	if c.maxSubs > 0 && c.commands > 1 && c.nameN > 0 {
		name := c.name[1:min(c.nameN, 1+int(c.name[0]))]
		if string(name) == "SUBSCRIBE" || string(name) == "CANCEL" {
			if c.subs++; c.subs > c.maxSubs {
				return &zmtpError{fmt.Sprintf("more than %d subscriptions", c.maxSubs)}
			}
		}
	}
	return nil
}

// handshaken reports whether the greeting and the first command (READY) have passed.
func (c *zmtpChecker) handshaken() bool { return c.commands > 0 }
