package kvevents

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// zmtpPeer is a ZMTP 3.0 peer over a raw stream (TCP or a Unix socket) with the NULL
// mechanism, written from the spec (rfc.zeromq.org/spec/23) so that the tests speak to the
// publisher the way any program on the network can, whatever ZMQ library either side uses.
type zmtpPeer struct {
	c net.Conn
	r *bufio.Reader
}

// dialZMTP connects to ep (tcp://host:port or ipc://path) and does the greeting and the
// READY handshake as a socket of type socketType. handshake false stops after the greeting.
func dialZMTP(t *testing.T, ep, socketType string, handshake bool) *zmtpPeer {
	return dialZMTPBuf(t, ep, socketType, handshake, 0)
}

// dialZMTPBuf is dialZMTP with a receive buffer of rcvbuf bytes (0: the system's): a peer
// with a small one that stops reading is stuck after a few KiB.
func dialZMTPBuf(t *testing.T, ep, socketType string, handshake bool, rcvbuf int) *zmtpPeer {
	t.Helper()
	var c net.Conn
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		switch {
		case strings.HasPrefix(ep, "tcp://"):
			c, err = net.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
			if err == nil && rcvbuf > 0 {
				_ = c.(*net.TCPConn).SetReadBuffer(rcvbuf)
			}
		case strings.HasPrefix(ep, "ipc://"):
			c, err = net.Dial("unix", strings.TrimPrefix(ep, "ipc://"))
			if err == nil && rcvbuf > 0 {
				_ = c.(*net.UnixConn).SetReadBuffer(rcvbuf)
			}
		default:
			t.Fatalf("dialZMTP: endpoint %q", ep)
		}
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the socket is being bound
	}
	if err != nil {
		t.Fatalf("dial %s: %v", ep, err)
	}
	p := &zmtpPeer{c: c, r: bufio.NewReaderSize(c, 1<<16)}
	t.Cleanup(func() { c.Close() })
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	p.write(t, greeting)
	p.setDeadline(10 * time.Second)
	theirs := make([]byte, 64)
	if _, err := io.ReadFull(p.r, theirs); err != nil {
		t.Fatalf("%s: reading the greeting: %v", ep, err)
	}
	if theirs[0] != 0xff || theirs[9] != 0x7f || theirs[10] != 3 {
		t.Fatalf("%s: greeting %x is not ZMTP 3", ep, theirs)
	}
	if !handshake {
		return p
	}
	name, value := "Socket-Type", socketType
	body := []byte("\x05READY")
	body = append(body, byte(len(name)))
	body = append(body, name...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(value)))
	body = append(body, value...)
	p.write(t, append([]byte{0x04, byte(len(body))}, body...))
	for {
		flags, b, err := p.readFrame()
		if err != nil {
			t.Fatalf("%s: reading READY: %v", ep, err)
		}
		if flags&0x04 != 0 && strings.HasPrefix(string(b), "\x05READY") {
			break
		}
	}
	p.setDeadline(0)
	return p
}

func (p *zmtpPeer) setDeadline(d time.Duration) {
	if d == 0 {
		_ = p.c.SetDeadline(time.Time{})
		return
	}
	_ = p.c.SetDeadline(time.Now().Add(d))
}

func (p *zmtpPeer) write(t *testing.T, b []byte) {
	t.Helper()
	_ = p.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := p.c.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// send writes frames as one message.
func (p *zmtpPeer) send(t *testing.T, frames ...[]byte) {
	t.Helper()
	var out []byte
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags |= 0x01
		}
		if len(f) > 255 {
			out = append(out, flags|0x02)
			out = binary.BigEndian.AppendUint64(out, uint64(len(f)))
		} else {
			out = append(out, flags, byte(len(f)))
		}
		out = append(out, f...)
	}
	p.write(t, out)
}

// readFrame reads one frame (commands included).
func (p *zmtpPeer) readFrame() (flags byte, body []byte, err error) {
	if flags, err = p.r.ReadByte(); err != nil {
		return 0, nil, err
	}
	var n uint64
	if flags&0x02 != 0 {
		var l [8]byte
		if _, err = io.ReadFull(p.r, l[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(l[:])
	} else {
		b, err := p.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n = uint64(b)
	}
	if n > 64<<20 {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	body = make([]byte, n)
	_, err = io.ReadFull(p.r, body)
	return flags, body, err
}

// recv reads one message (commands skipped).
func (p *zmtpPeer) recv() ([][]byte, error) {
	var msg [][]byte
	for {
		flags, b, err := p.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&0x04 != 0 {
			continue
		}
		msg = append(msg, b)
		if flags&0x01 == 0 {
			return msg, nil
		}
	}
}

// subscribe sends a ZMTP 3.0 subscription to every topic.
func (p *zmtpPeer) subscribe(t *testing.T) { p.send(t, []byte{1}) }

// closedWithin reports whether the other side closes the connection within d (what it
// sends meanwhile is read and dropped).
func (p *zmtpPeer) closedWithin(d time.Duration) bool {
	p.setDeadline(d)
	defer p.setDeadline(0)
	buf := make([]byte, 1<<16)
	for {
		if _, err := p.r.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return false
			}
			return true
		}
	}
}

// hugeFrame is a frame header that declares size bytes: as a command (during the
// handshake, after the greeting) or as a message (after it).
func hugeFrame(command bool, size uint64) []byte {
	flags := byte(0x02)
	if command {
		flags |= 0x04
	}
	return binary.BigEndian.AppendUint64([]byte{flags}, size)
}

// freeTCP is a loopback TCP endpoint nothing listens on (it was free a moment ago).
func freeTCP(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return fmt.Sprintf("tcp://%s:%d", host, port)
}

// dialable is the address a peer dials for a bound endpoint.
func dialable(ep string) string { return strings.Replace(ep, "*", "127.0.0.1", 1) }
