package storage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// A minimal RESP2 client: just what the Redis backend needs (pipelined commands, bulk
// replies read straight into caller buffers, no allocation per page).

// redisError is an error reply ("-ERR ...") from the server. The connection stays usable.
type redisError string

func (e redisError) Error() string { return "redis: " + string(e) }

// errProtocol marks a reply the client cannot parse; the connection is dropped.
var errProtocol = errors.New("storage: redis protocol error")

const respBufSize = 64 << 10

type respConn struct {
	nc   net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	num  []byte           // scratch for formatting integers and keys
	hdr  [HeaderSize]byte // scratch for value headers
	crlf [2]byte
}

func dialResp(ctx context.Context, addr, user, pass string) (*respConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &respConn{nc: nc, r: bufio.NewReaderSize(nc, respBufSize), w: bufio.NewWriterSize(nc, respBufSize), num: make([]byte, 0, 128)}
	if pass != "" {
		if dl, ok := ctx.Deadline(); ok {
			nc.SetDeadline(dl)
		}
		if user != "" {
			c.writeArrayHeader(3)
			c.writeBulkString("AUTH")
			c.writeBulkString(user)
		} else {
			c.writeArrayHeader(2)
			c.writeBulkString("AUTH")
		}
		c.writeBulkString(pass)
		if err = c.w.Flush(); err == nil {
			err = c.readStatus()
		}
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("auth: %w", err)
		}
	}
	return c, nil
}

func (c *respConn) close() { c.nc.Close() }

// --- writing -------------------------------------------------------------------------------

func (c *respConn) writeArrayHeader(n int) {
	c.num = append(c.num[:0], '*')
	c.num = strconv.AppendInt(c.num, int64(n), 10)
	c.num = append(c.num, '\r', '\n')
	c.w.Write(c.num)
}

func (c *respConn) writeBulkHeader(n int) {
	c.num = append(c.num[:0], '$')
	c.num = strconv.AppendInt(c.num, int64(n), 10)
	c.num = append(c.num, '\r', '\n')
	c.w.Write(c.num)
}

func (c *respConn) writeBulkString(s string) {
	c.writeBulkHeader(len(s))
	c.w.WriteString(s)
	c.w.WriteString("\r\n")
}

func (c *respConn) writeBulk(b []byte) {
	c.writeBulkHeader(len(b))
	c.w.Write(b)
	c.w.WriteString("\r\n")
}

// --- reading -------------------------------------------------------------------------------

// readLine returns the next line without its CRLF. The slice is valid until the next read.
func (c *respConn) readLine() ([]byte, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", errProtocol, respBufSize)
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: bad line %q", errProtocol, line)
	}
	return line[:len(line)-2], nil
}

// parseInt parses a RESP integer without allocating.
func parseInt(b []byte) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	digits := b
	if neg {
		digits = b[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, fmt.Errorf("%w: bad integer %q", errProtocol, b)
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: bad integer %q", errProtocol, b)
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// readHeader reads a reply's type line. For '-' it returns a redisError.
func (c *respConn) readHeader() (byte, []byte, error) {
	line, err := c.readLine()
	if err != nil {
		return 0, nil, err
	}
	if line[0] == '-' {
		return '-', nil, redisError(line[1:])
	}
	return line[0], line[1:], nil
}

// readInt reads an integer reply (":n").
func (c *respConn) readInt() (int64, error) {
	t, rest, err := c.readHeader()
	if err != nil {
		return 0, err
	}
	if t != ':' {
		return 0, fmt.Errorf("%w: want an integer reply, got %q", errProtocol, t)
	}
	return parseInt(rest)
}

// readStatus reads a simple-string reply ("+OK").
func (c *respConn) readStatus() error {
	t, _, err := c.readHeader()
	if err != nil {
		return err
	}
	if t != '+' {
		return fmt.Errorf("%w: want a status reply, got %q", errProtocol, t)
	}
	return nil
}

// readLen reads an array ('*') or bulk ('$') length; -1 is a null.
func (c *respConn) readLen(want byte) (int64, error) {
	t, rest, err := c.readHeader()
	if err != nil {
		return 0, err
	}
	if t != want {
		return 0, fmt.Errorf("%w: want %q reply, got %q", errProtocol, want, t)
	}
	return parseInt(rest)
}

// readCRLF consumes the CRLF that ends a bulk string.
func (c *respConn) readCRLF() error {
	if _, err := io.ReadFull(c.r, c.crlf[:]); err != nil {
		return err
	}
	if c.crlf != [2]byte{'\r', '\n'} {
		return fmt.Errorf("%w: bulk string not terminated by CRLF", errProtocol)
	}
	return nil
}

// readBulkBytes reads a bulk reply into a new slice (nil for a null). Not for pages.
func (c *respConn) readBulkBytes() ([]byte, error) {
	n, err := c.readLen('$')
	if err != nil || n < 0 {
		return nil, err
	}
	if n > MaxValueSize+HeaderSize {
		return nil, fmt.Errorf("%w: bulk of %d bytes", errProtocol, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		return nil, err
	}
	return b, c.readCRLF()
}

// --- pool ----------------------------------------------------------------------------------

// respPool keeps idle connections and dials new ones on demand, so a restarted server is
// picked up by the next call without any reconnect loop.
type respPool struct {
	addr, user, pass string
	maxIdle          int

	mu     sync.Mutex // protects idle and closed
	idle   []*respConn
	closed bool
}

func (p *respPool) get(ctx context.Context) (c *respConn, reused bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, ErrClosed
	}
	if n := len(p.idle); n > 0 {
		c = p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, true, nil
	}
	p.mu.Unlock()
	c, err = dialResp(ctx, p.addr, p.user, p.pass)
	return c, false, err
}

func (p *respPool) put(c *respConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// dropIdle closes every idle connection (after one failed: the others are likely dead too).
func (p *respPool) dropIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}

func (p *respPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.dropIdle()
}

// do runs fn on a connection under ctx's deadline. fn writes its commands, flushes, and
// reads every reply (it must read them all even after an error reply, and return the first
// redisError then, so the connection stays in sync). A failure on a reused connection
// before ctx ends is retried once on a fresh one: it is usually a connection the server
// closed while idle (a restart). fn must therefore be idempotent and reset its outputs.
func (p *respPool) do(ctx context.Context, fn func(c *respConn) error) error {
	for attempt := 0; ; attempt++ {
		c, reused, err := p.get(ctx)
		if err != nil {
			return err
		}
		clean, err := runArmed(ctx, c, fn)
		var re redisError
		if err == nil || errors.As(err, &re) {
			if clean {
				p.put(c)
			} else {
				c.close()
			}
			return err
		}
		c.close()
		p.dropIdle()
		if reused && attempt == 0 && ctx.Err() == nil && !isTimeout(err) {
			continue
		}
		return err
	}
}

// runArmed runs fn with the connection's deadline set from ctx, and cancellation of ctx
// interrupting blocked I/O. clean is false when the cancellation hook fired (or may still
// be firing): the connection's deadline is then not ours to trust and it must be closed.
func runArmed(ctx context.Context, c *respConn, fn func(c *respConn) error) (clean bool, err error) {
	dl, _ := ctx.Deadline() // callers always give a deadline (callContext)
	if err := c.nc.SetDeadline(dl); err != nil {
		return false, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	err = fn(c)
	clean = stop()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	case isTimeout(err) && !time.Now().Before(dl):
		// The connection's deadline is the context's; its timer may just not have fired yet.
		err = fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return clean, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
