// Package zmq is the small part of libzmq (ZeroMQ 4.x) that cpcache's KV-event publisher
// needs, loaded at run time with dlopen and called through github.com/ebitengine/purego (no
// cgo: the package builds with CGO_ENABLED=0): contexts, sockets, integer and byte options,
// bind and connect, multipart send and receive (blocking or ZMQ_DONTWAIT), poll and socket
// monitors.
//
// libzmq.so.5 (Debian's libzmq5) is opened on first use, not at program start: a binary that
// never asks for a socket runs without it. Open reports a *LoadError naming the library, the
// Debian package and what was tried when it is missing. The library stays loaded once
// opened (its contexts run I/O threads).
//
// A Socket, as in libzmq, must not be used by two goroutines at once; the caller serialises
// (one goroutine per socket, or a mutex).
package zmq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Library is the default soname, DebianPackage the package that ships it, Env the
// environment variable that names another file (exclusively, when set).
const (
	Library       = "libzmq.so.5"
	DebianPackage = "libzmq5"
	Env           = "CPCACHE_ZMQ_LIBRARY"
)

// ErrLibraryNotFound: no candidate of libzmq could be loaded (see LoadError).
var ErrLibraryNotFound = errors.New("library not found")

// ErrMissingSymbol: the library opened but lacks entry points this package needs.
var ErrMissingSymbol = errors.New("library too old: missing symbols")

// LoadError reports why libzmq could not be loaded.
type LoadError struct {
	Tried  []string // candidate paths, in order
	Reason error    // ErrLibraryNotFound or ErrMissingSymbol
	Detail string   // dlerror messages per candidate, or the missing symbols
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("zmq: cannot load %s (%v; install Debian's %s, or set %s to its path): %s",
		Library, e.Reason, DebianPackage, Env, e.Detail)
}

func (e *LoadError) Unwrap() error { return e.Reason }

// candidates are the files tried: $CPCACHE_ZMQ_LIBRARY alone when set, else the soname
// through the dynamic linker, then the usual library directories.
func candidates() []string {
	if p := os.Getenv(Env); p != "" {
		return []string{p}
	}
	out := []string{Library}
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/lib"} {
		p := d + "/" + Library
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// table is the loaded library: its path and the address of every entry point used here
// (ZMQ 4.x ABI, declared from zmq.h: contexts and sockets are opaque pointers, errors are -1
// or NULL with the reason in zmq_errno()). Every field is non-zero once Open succeeds.
type table struct {
	path string

	version, errno, strerror                    uintptr
	ctxNew, ctxTerm, socket, close              uintptr
	setsockopt, getsockopt, bind, connect, send uintptr
	msgInit, msgRecv, msgData, msgSize, msgMore uintptr
	msgClose, poll, socketMonitor               uintptr
}

// symbols lists t's entry points with their exported names and the first ZMQ version that
// has them (for the message when one is missing).
func (t *table) symbols() []struct {
	name, since string
	addr        *uintptr
} {
	return []struct {
		name, since string
		addr        *uintptr
	}{
		{"zmq_version", "4.0", &t.version},
		{"zmq_errno", "4.0", &t.errno},
		{"zmq_strerror", "4.0", &t.strerror},
		{"zmq_ctx_new", "4.0", &t.ctxNew},
		{"zmq_ctx_term", "4.0", &t.ctxTerm},
		{"zmq_socket", "4.0", &t.socket},
		{"zmq_close", "4.0", &t.close},
		{"zmq_setsockopt", "4.0", &t.setsockopt},
		{"zmq_getsockopt", "4.0", &t.getsockopt},
		{"zmq_bind", "4.0", &t.bind},
		{"zmq_connect", "4.0", &t.connect},
		{"zmq_send", "4.0", &t.send},
		{"zmq_msg_init", "4.0", &t.msgInit},
		{"zmq_msg_recv", "4.0", &t.msgRecv},
		{"zmq_msg_data", "4.0", &t.msgData},
		{"zmq_msg_size", "4.0", &t.msgSize},
		{"zmq_msg_more", "4.0", &t.msgMore},
		{"zmq_msg_close", "4.0", &t.msgClose},
		{"zmq_poll", "4.0", &t.poll},
		{"zmq_socket_monitor", "4.0", &t.socketMonitor},
	}
}

var (
	openMu sync.Mutex            // serialises loading
	lib    atomic.Pointer[table] // the loaded library; nil until Open succeeds, then never changes
)

// Open loads libzmq (once; later calls return at once) and returns the path it came from:
// the first candidate that dlopen accepts, with every entry point resolved there and then
// (a library lacking one fails here, not at its first use). The library stays loaded once
// opened (its contexts run I/O threads).
func Open() (string, error) {
	if t := lib.Load(); t != nil {
		return t.path, nil
	}
	openMu.Lock()
	defer openMu.Unlock()
	if t := lib.Load(); t != nil {
		return t.path, nil
	}
	cands := candidates()
	// dlerror's message is per thread: read it on the thread whose dlopen failed.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var h uintptr
	var why []string
	t := &table{}
	for _, c := range cands {
		p, err := purego.Dlopen(c, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err == nil {
			h, t.path = p, c
			break
		}
		msg := err.Error()
		if msg == "" {
			msg = "unknown dlopen error"
		}
		if !strings.HasPrefix(msg, c) { // dlerror usually names the file already
			msg = c + ": " + msg
		}
		why = append(why, msg)
	}
	if h == 0 {
		return "", &LoadError{Tried: cands, Reason: ErrLibraryNotFound, Detail: strings.Join(why, "; ")}
	}
	var missing []string
	for _, s := range t.symbols() {
		p, err := purego.Dlsym(h, s.name)
		if err != nil || p == 0 {
			missing = append(missing, s.name+" (since ZMQ "+s.since+")")
		}
		*s.addr = p
	}
	if len(missing) > 0 {
		_ = purego.Dlclose(h)
		plural := ""
		if len(missing) > 1 {
			plural = "s"
		}
		return "", &LoadError{Tried: cands, Reason: ErrMissingSymbol,
			Detail: fmt.Sprintf("%s: missing symbol%s %s", t.path, plural, strings.Join(missing, ", "))}
	}
	if major, minor, patch := t.versionOf(); major < 4 {
		_ = purego.Dlclose(h)
		return "", &LoadError{Tried: cands, Reason: ErrMissingSymbol, Detail: fmt.Sprintf("version %d.%d.%d, want 4.x", major, minor, patch)}
	}
	lib.Store(t)
	return t.path, nil
}

func (t *table) versionOf() (major, minor, patch int) {
	var v [3]int32
	purego.SyscallN(t.version, uintptr(unsafe.Pointer(&v[0])), uintptr(unsafe.Pointer(&v[1])), uintptr(unsafe.Pointer(&v[2])))
	return int(v[0]), int(v[1]), int(v[2])
}

// Version is the loaded library's version (Open first).
func Version() (major, minor, patch int, err error) {
	if _, err = Open(); err != nil {
		return 0, 0, 0, err
	}
	major, minor, patch = lib.Load().versionOf()
	return major, minor, patch, nil
}

// How calls into libzmq go (purego.SyscallN, no cgo):
//   - C pointers (contexts, sockets, what zmq_msg_data returns) are uintptrs to Go.
//   - Go memory is passed only for the duration of a call, converted to uintptr in the
//     call's argument list: SyscallN is //go:uintptrescapes, so what such an argument points
//     to lives on the heap (a stack move cannot leave C with a stale address) and stays alive
//     until the call returns. libzmq keeps no pointer to any of it: zmq_send copies the bytes,
//     zmq_setsockopt copies the value, zmq_poll and the zmq_msg_* calls use their argument
//     only while they run.
//   - errno is per thread and a goroutine may change threads between two calls: every method
//     that calls libzmq holds its OS thread (runtime.LockOSThread) from the call until
//     zmq_errno() has been read.
//   - int results come back in a 64-bit register whose upper half is unspecified: they are
//     read as int32.

// cptr turns an address libzmq returned into a pointer, to read the bytes there.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// gostring copies the NUL-terminated C string at p.
func gostring(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(cptr(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(cptr(p)), n))
}

// cstring is s NUL-terminated for libzmq; a NUL inside s (which C would read as the end) is
// an error naming s.
func cstring(what, s string) ([]byte, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, fmt.Errorf("zmq: %s %q holds a NUL byte", what, s)
	}
	return append([]byte(s), 0), nil
}

// lastErrno is zmq_errno() after a failed call, on the caller's locked thread.
func (t *table) lastErrno() Errno {
	e, _, _ := purego.SyscallN(t.errno)
	if int32(e) == 0 {
		return Errno(syscall.EINVAL)
	}
	return Errno(int32(e))
}

// Errno is an error libzmq reported: a POSIX errno or one of libzmq's own (ETERM...).
type Errno syscall.Errno

// Errors the callers tell apart.
const (
	EAGAIN       = Errno(syscall.EAGAIN)
	EHOSTUNREACH = Errno(syscall.EHOSTUNREACH)
	EINTR        = Errno(syscall.EINTR)
	ETERM        = Errno(156384712 + 53) // ZMQ_HAUSNUMERO + 53
)

func (e Errno) Error() string {
	if t := lib.Load(); t != nil {
		r, _, _ := purego.SyscallN(t.strerror, uintptr(int32(e)))
		return gostring(r)
	}
	if e == ETERM {
		return "Context was terminated"
	}
	return syscall.Errno(e).Error()
}

// Is lets errors.Is(err, syscall.EAGAIN) hold for the matching Errno.
func (e Errno) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && Errno(t) == e
}

// Socket types.
type Type int

const (
	PAIR   Type = 0
	PUB    Type = 1
	SUB    Type = 2
	REQ    Type = 3
	DEALER Type = 5
	ROUTER Type = 6
)

// Socket options (zmq.h values).
const (
	RoutingID       = 5
	Subscribe       = 6
	RcvMore         = 13
	Events          = 15 // PollIn | PollOut now; reading it processes the socket's commands
	Linger          = 17
	MaxMsgSize      = 22 // int64
	SndHWM          = 23
	RcvHWM          = 24
	LastEndpoint    = 32
	RouterMandatory = 33
	Immediate       = 39
	IPv6            = 42
	HandshakeIvl    = 66
)

// Send and receive flags.
const (
	DontWait = 1
	SndMore  = 2
)

// Poll events.
const (
	PollIn  = 1
	PollOut = 2
)

// Monitor events (zmq_socket_monitor).
const (
	EventConnected              = 0x0001
	EventListening              = 0x0008
	EventAccepted               = 0x0020
	EventClosed                 = 0x0080
	EventDisconnected           = 0x0200
	EventMonitorStopped         = 0x0400
	EventHandshakeFailedNoDtl   = 0x0800
	EventHandshakeSucceeded     = 0x1000
	EventHandshakeFailedProto   = 0x2000
	EventHandshakeFailedAuth    = 0x4000
	EventAll                    = 0xffff
	EventHandshakeFailedAnyMask = EventHandshakeFailedNoDtl | EventHandshakeFailedProto | EventHandshakeFailedAuth
)

// Context is a libzmq context (its I/O threads). Close it after its sockets.
type Context struct {
	mu sync.Mutex
	p  uintptr // void *; 0 once closed
}

// NewContext loads libzmq when needed and makes a context.
func NewContext() (*Context, error) {
	if _, err := Open(); err != nil {
		return nil, err
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, _, _ := purego.SyscallN(t.ctxNew)
	if p == 0 {
		return nil, fmt.Errorf("zmq: zmq_ctx_new: %w", t.lastErrno())
	}
	return &Context{p: p}, nil
}

// Close terminates the context: it waits for every socket to be closed and for their
// linger (every Socket made here lingers at most what SetInt(Linger) says, 0 by default).
// Idempotent.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == 0 {
		return nil
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		rc, _, _ := purego.SyscallN(t.ctxTerm, c.p)
		if int32(rc) == 0 {
			break
		}
		if e := t.lastErrno(); e != EINTR {
			c.p = 0
			return fmt.Errorf("zmq: zmq_ctx_term: %w", e)
		}
	}
	c.p = 0
	return nil
}

// zmqMsg is a zmq_msg_t: 64 bytes, aligned as a pointer (zmq.h). A Socket's own one receives
// frames during Recv (initialised at its start, closed at its end); libzmq uses it only during
// the zmq_msg_* calls that are handed its address.
type zmqMsg [8]uint64

// pollItem is a zmq_pollitem_t on POSIX: {void *socket; int fd; short events; short
// revents}, 16 bytes on 64-bit.
type pollItem struct {
	socket  uintptr
	fd      int32
	events  int16
	revents int16
}

// Socket is one libzmq socket; use it from one goroutine at a time.
type Socket struct {
	p   uintptr // void *; 0 once closed
	typ Type
	msg *zmqMsg // the frame Recv is receiving

	args [3]uintptr // msgCall's arguments
}

// msgCall calls fn (zmq_msg_recv or a zmq_msg_* function) with the first n of a1..a3,
// handed over from s.args so that no argument slice is allocated per call (Recv makes four
// calls a frame). Every argument is an integer, a C pointer or the address of s.msg, which
// is heap memory the caller keeps alive: none needs SyscallN's escape of its arguments.
func (s *Socket) msgCall(fn uintptr, n int, a1, a2, a3 uintptr) uintptr {
	s.args = [3]uintptr{a1, a2, a3}
	r, _, _ := purego.SyscallN(fn, s.args[:n]...)
	return r
}

// Socket makes a socket of type t with ZMQ_LINGER 0 (Close never waits on a peer).
func (c *Context) Socket(t Type) (*Socket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == 0 {
		return nil, errors.New("zmq: context closed")
	}
	z := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, _, _ := purego.SyscallN(z.socket, c.p, uintptr(t))
	if p == 0 {
		return nil, fmt.Errorf("zmq: zmq_socket(%d): %w", t, z.lastErrno())
	}
	s := &Socket{p: p, typ: t, msg: new(zmqMsg)}
	if err := s.SetInt(Linger, 0); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the socket. Idempotent.
func (s *Socket) Close() error {
	if s == nil || s.p == 0 {
		return nil
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc, _, _ := purego.SyscallN(t.close, s.p)
	s.p = 0
	if int32(rc) != 0 {
		return fmt.Errorf("zmq: zmq_close: %w", t.lastErrno())
	}
	return nil
}

func (s *Socket) live() error {
	if s == nil || s.p == 0 {
		return errors.New("zmq: socket closed")
	}
	return nil
}

// SetInt sets an integer option (MaxMsgSize is sent as the int64 it is).
func (s *Socket) SetInt(opt int, v int64) error {
	if err := s.live(); err != nil {
		return err
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var rc uintptr
	if opt == MaxMsgSize {
		x := v
		rc, _, _ = purego.SyscallN(t.setsockopt, s.p, uintptr(opt), uintptr(unsafe.Pointer(&x)), unsafe.Sizeof(x))
	} else {
		x := int32(v)
		rc, _, _ = purego.SyscallN(t.setsockopt, s.p, uintptr(opt), uintptr(unsafe.Pointer(&x)), unsafe.Sizeof(x))
	}
	if int32(rc) != 0 {
		return fmt.Errorf("zmq: setsockopt %d = %d: %w", opt, v, t.lastErrno())
	}
	return nil
}

// SetBytes sets a byte-string option (Subscribe, RoutingID).
func (s *Socket) SetBytes(opt int, v []byte) error {
	if err := s.live(); err != nil {
		return err
	}
	t := lib.Load()
	buf := append(append(make([]byte, 0, len(v)+1), v...), 0) // never a nil pointer, even for no bytes
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc, _, _ := purego.SyscallN(t.setsockopt, s.p, uintptr(opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(v)))
	runtime.KeepAlive(buf)
	if int32(rc) != 0 {
		return fmt.Errorf("zmq: setsockopt %d: %w", opt, t.lastErrno())
	}
	return nil
}

// GetString reads a string option (LastEndpoint).
func (s *Socket) GetString(opt int) (string, error) {
	if err := s.live(); err != nil {
		return "", err
	}
	t := lib.Load()
	buf := make([]byte, 1024)
	n := uintptr(len(buf)) // size_t, in and out
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc, _, _ := purego.SyscallN(t.getsockopt, s.p, uintptr(opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)))
	runtime.KeepAlive(buf)
	if int32(rc) != 0 {
		return "", fmt.Errorf("zmq: getsockopt %d: %w", opt, t.lastErrno())
	}
	b := buf[:min(n, uintptr(len(buf)))]
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b), nil
}

// GetInt reads an int option (Events, SndHWM, RcvHWM). Reading Events also makes libzmq
// process the commands its I/O threads left for the socket, whenever it is read: Send
// processes them only when about a millisecond (3 million CPU ticks) has passed since it
// last did, so a socket that only sends sees what its peers have taken up to that late.
func (s *Socket) GetInt(opt int) (int, error) {
	if err := s.live(); err != nil {
		return 0, err
	}
	t := lib.Load()
	var x int32
	n := unsafe.Sizeof(x) // size_t, in and out
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc, _, _ := purego.SyscallN(t.getsockopt, s.p, uintptr(opt), uintptr(unsafe.Pointer(&x)), uintptr(unsafe.Pointer(&n)))
	if int32(rc) != 0 {
		return 0, fmt.Errorf("zmq: getsockopt %d: %w", opt, t.lastErrno())
	}
	return int(x), nil
}

// endpointCall runs bind or connect (fn) on ep.
func (s *Socket) endpointCall(fn uintptr, what, ep string) error {
	if err := s.live(); err != nil {
		return err
	}
	cs, err := cstring("endpoint", ep)
	if err != nil {
		return err
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc, _, _ := purego.SyscallN(fn, s.p, uintptr(unsafe.Pointer(&cs[0])))
	runtime.KeepAlive(cs)
	if int32(rc) != 0 {
		return fmt.Errorf("zmq: %s %q: %w", what, ep, t.lastErrno())
	}
	return nil
}

// Bind binds the socket to ep.
func (s *Socket) Bind(ep string) error {
	if err := s.live(); err != nil {
		return err
	}
	return s.endpointCall(lib.Load().bind, "bind", ep)
}

// Connect connects the socket to ep (libzmq retries in the background).
func (s *Socket) Connect(ep string) error {
	if err := s.live(); err != nil {
		return err
	}
	return s.endpointCall(lib.Load().connect, "connect", ep)
}

// Send sends frames as one multipart message. flags may hold DontWait: libzmq then either
// queues the whole message or fails with EAGAIN (a full queue) or, on a ROUTER with
// RouterMandatory, EHOSTUNREACH (no such peer) on the first frame, having sent nothing.
func (s *Socket) Send(flags int, frames ...[]byte) error {
	if err := s.live(); err != nil {
		return err
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i, f := range frames {
		fl := flags
		if i < len(frames)-1 {
			fl |= SndMore
		}
		for {
			var rc uintptr
			if len(f) > 0 {
				// zmq_send copies the bytes before it returns.
				rc, _, _ = purego.SyscallN(t.send, s.p, uintptr(unsafe.Pointer(&f[0])), uintptr(len(f)), uintptr(fl))
			} else {
				rc, _, _ = purego.SyscallN(t.send, s.p, 0, 0, uintptr(fl))
			}
			runtime.KeepAlive(f)
			if int32(rc) >= 0 {
				break
			}
			// A signal (the Go runtime's preemption signal among them) interrupts libzmq's
			// wait on its command mailbox; the frame was not taken, so it is sent again.
			if e := t.lastErrno(); e != EINTR {
				return e
			}
		}
	}
	return nil
}

// Recv receives one multipart message. It keeps at most maxFrames frames (the rest are
// read and dropped) and reports how many it dropped. flags may hold DontWait (EAGAIN when
// none is waiting).
func (s *Socket) Recv(flags, maxFrames int) (frames [][]byte, dropped int, err error) {
	if err := s.live(); err != nil {
		return nil, 0, err
	}
	t := lib.Load()
	m := uintptr(unsafe.Pointer(s.msg)) // heap memory that stays put; libzmq keeps no pointer to it
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// One message object serves every frame: zmq_msg_recv releases what it held before
	// taking the next frame, and keeps it valid when it fails; zmq_msg_close releases the last.
	s.msgCall(t.msgInit, 1, m, 0, 0) // cannot fail
	defer func() {
		s.msgCall(t.msgClose, 1, m, 0, 0)
		runtime.KeepAlive(s.msg)
	}()
	for {
		rc := s.msgCall(t.msgRecv, 3, m, s.p, uintptr(flags))
		if int32(rc) < 0 {
			e := t.lastErrno()
			if e == EINTR {
				continue // interrupted by a signal before a frame was taken: ask again
			}
			if len(frames) > 0 || dropped > 0 {
				// Frames of one message arrive together; a failure here is ETERM or the like.
				return frames, dropped, e
			}
			return nil, 0, e
		}
		if len(frames) < maxFrames {
			// The bytes are libzmq's (or, for a small frame, inside the message itself)
			// until the next zmq_msg_recv or zmq_msg_close: copy them out now. zmq_msg_recv
			// returned the size, clamped to INT_MAX.
			size := uintptr(int32(rc))
			if int32(rc) == math.MaxInt32 {
				size = s.msgCall(t.msgSize, 1, m, 0, 0)
			}
			b := make([]byte, size)
			if size > 0 {
				data := s.msgCall(t.msgData, 1, m, 0, 0)
				copy(b, unsafe.Slice((*byte)(cptr(data)), size))
			}
			frames = append(frames, b)
		} else {
			dropped++
		}
		if more := s.msgCall(t.msgMore, 1, m, 0, 0); int32(more) == 0 {
			return frames, dropped, nil
		}
		flags &^= DontWait // the rest of a message is there already
	}
}

// PollItem is one socket of a Poll with the events asked; Poll sets Ready.
type PollItem struct {
	Socket *Socket
	Events int
	Ready  int
}

// Poll waits up to timeoutMs (never forever: a negative value is refused) for an event of
// items and returns how many are ready.
func Poll(items []PollItem, timeoutMs int) (int, error) {
	if timeoutMs < 0 {
		return 0, errors.New("zmq: poll without a timeout")
	}
	if len(items) == 0 {
		return 0, nil
	}
	c := make([]pollItem, len(items))
	for i, it := range items {
		if err := it.Socket.live(); err != nil {
			return 0, err
		}
		c[i] = pollItem{socket: it.Socket.p, events: int16(it.Events)}
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n, _, _ := purego.SyscallN(t.poll, uintptr(unsafe.Pointer(&c[0])), uintptr(len(c)), uintptr(timeoutMs))
	runtime.KeepAlive(c)
	if int32(n) < 0 {
		e := t.lastErrno()
		if e == EINTR {
			return 0, nil // a signal cut the wait short: as a timeout, the caller polls again
		}
		return 0, e
	}
	for i := range items {
		items[i].Ready = int(c[i].revents)
	}
	return int(int32(n)), nil
}

// Monitor asks libzmq to report s's events (a mask of Event*) on a PAIR socket bound to
// ep (an inproc:// name); MonitorEvent decodes what that socket receives.
func (s *Socket) Monitor(ep string, events int) error {
	if err := s.live(); err != nil {
		return err
	}
	cs, err := cstring("monitor endpoint", ep)
	if err != nil {
		return err
	}
	t := lib.Load()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc, _, _ := purego.SyscallN(t.socketMonitor, s.p, uintptr(unsafe.Pointer(&cs[0])), uintptr(int32(events)))
	runtime.KeepAlive(cs)
	if int32(rc) != 0 {
		return fmt.Errorf("zmq: socket monitor on %q: %w", ep, t.lastErrno())
	}
	return nil
}

// MonitorEvent decodes a monitor message: [event (uint16) value (uint32), endpoint].
func MonitorEvent(frames [][]byte) (event int, value uint32, endpoint string, ok bool) {
	if len(frames) != 2 || len(frames[0]) != 6 {
		return 0, 0, "", false
	}
	return int(binary.NativeEndian.Uint16(frames[0])), binary.NativeEndian.Uint32(frames[0][2:]), string(frames[1]), true
}
