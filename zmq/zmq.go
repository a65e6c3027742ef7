// Package zmq is the small part of libzmq (ZeroMQ 4.x) that cpcache's KV-event publisher
// needs, loaded at run time with dlopen: contexts, sockets, integer and byte options, bind
// and connect, multipart send and receive (blocking or ZMQ_DONTWAIT), poll and socket
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

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "zmq_api.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"
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

var (
	openMu sync.Mutex
	opened string // the path once loaded
)

// Open loads libzmq (once; later calls return at once) and returns the path it came from.
func Open() (string, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if opened != "" {
		return opened, nil
	}
	cands := candidates()
	arr := C.malloc(C.size_t(len(cands)+1) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(arr)
	view := unsafe.Slice((**C.char)(arr), len(cands)+1)
	for i, c := range cands {
		view[i] = C.CString(c)
		defer C.free(unsafe.Pointer(view[i]))
	}
	view[len(cands)] = nil
	errbuf := make([]byte, 8192)
	rc := C.cp_zmq_open((**C.char)(arr), C.int(len(cands)), (*C.char)(unsafe.Pointer(&errbuf[0])), C.size_t(len(errbuf)))
	if rc != C.CP_LOAD_OK {
		le := &LoadError{Tried: cands, Detail: cstr(errbuf), Reason: ErrLibraryNotFound}
		if rc == C.CP_LOAD_MISSING_SYMBOL {
			le.Reason = ErrMissingSymbol
		}
		return "", le
	}
	var major, minor, patch C.int
	C.cp_zmq_version(&major, &minor, &patch)
	if major < 4 {
		return "", &LoadError{Tried: cands, Reason: ErrMissingSymbol, Detail: fmt.Sprintf("version %d.%d.%d, want 4.x", major, minor, patch)}
	}
	pathbuf := make([]byte, 4096)
	C.cp_zmq_path((*C.char)(unsafe.Pointer(&pathbuf[0])), C.size_t(len(pathbuf)))
	opened = cstr(pathbuf)
	return opened, nil
}

// Version is the loaded library's version (Open first).
func Version() (major, minor, patch int, err error) {
	if _, err = Open(); err != nil {
		return 0, 0, 0, err
	}
	var a, b, c C.int
	C.cp_zmq_version(&a, &b, &c)
	return int(a), int(b), int(c), nil
}

func cstr(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
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

func (e Errno) Error() string { return C.GoString(C.cp_zmq_strerror(C.int(e))) }

// Is lets errors.Is(err, syscall.EAGAIN) hold for the matching Errno.
func (e Errno) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && Errno(t) == e
}

// errnoOf converts the error cgo captured after a failing call.
func errnoOf(err error) error {
	var e syscall.Errno
	if errors.As(err, &e) {
		return Errno(e)
	}
	if err == nil {
		return Errno(syscall.EINVAL)
	}
	return err
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
	p  unsafe.Pointer
}

// NewContext loads libzmq when needed and makes a context.
func NewContext() (*Context, error) {
	if _, err := Open(); err != nil {
		return nil, err
	}
	p, err := C.cp_zmq_ctx_new()
	if p == nil {
		return nil, fmt.Errorf("zmq: zmq_ctx_new: %w", errnoOf(err))
	}
	return &Context{p: p}, nil
}

// Close terminates the context: it waits for every socket to be closed and for their
// linger (every Socket made here lingers at most what SetInt(Linger) says, 0 by default).
// Idempotent.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == nil {
		return nil
	}
	for {
		rc, err := C.cp_zmq_ctx_term(c.p)
		if rc == 0 {
			break
		}
		if e := errnoOf(err); e != EINTR {
			c.p = nil
			return fmt.Errorf("zmq: zmq_ctx_term: %w", e)
		}
	}
	c.p = nil
	return nil
}

// Socket is one libzmq socket; use it from one goroutine at a time.
type Socket struct {
	p   unsafe.Pointer
	typ Type
}

// Socket makes a socket of type t with ZMQ_LINGER 0 (Close never waits on a peer).
func (c *Context) Socket(t Type) (*Socket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == nil {
		return nil, errors.New("zmq: context closed")
	}
	p, err := C.cp_zmq_socket(c.p, C.int(t))
	if p == nil {
		return nil, fmt.Errorf("zmq: zmq_socket(%d): %w", t, errnoOf(err))
	}
	s := &Socket{p: p, typ: t}
	if err := s.SetInt(Linger, 0); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the socket. Idempotent.
func (s *Socket) Close() error {
	if s == nil || s.p == nil {
		return nil
	}
	rc, err := C.cp_zmq_close(s.p)
	s.p = nil
	if rc != 0 {
		return fmt.Errorf("zmq: zmq_close: %w", errnoOf(err))
	}
	return nil
}

func (s *Socket) live() error {
	if s == nil || s.p == nil {
		return errors.New("zmq: socket closed")
	}
	return nil
}

// SetInt sets an integer option (MaxMsgSize is sent as the int64 it is).
func (s *Socket) SetInt(opt int, v int64) error {
	if err := s.live(); err != nil {
		return err
	}
	var rc C.int
	var err error
	if opt == MaxMsgSize {
		x := C.int64_t(v)
		rc, err = C.cp_zmq_setsockopt(s.p, C.int(opt), unsafe.Pointer(&x), C.size_t(unsafe.Sizeof(x)))
	} else {
		x := C.int(v)
		rc, err = C.cp_zmq_setsockopt(s.p, C.int(opt), unsafe.Pointer(&x), C.size_t(unsafe.Sizeof(x)))
	}
	if rc != 0 {
		return fmt.Errorf("zmq: setsockopt %d = %d: %w", opt, v, errnoOf(err))
	}
	return nil
}

// SetBytes sets a byte-string option (Subscribe, RoutingID).
func (s *Socket) SetBytes(opt int, v []byte) error {
	if err := s.live(); err != nil {
		return err
	}
	p := C.CBytes(append(v, 0))
	defer C.free(p)
	rc, err := C.cp_zmq_setsockopt(s.p, C.int(opt), p, C.size_t(len(v)))
	if rc != 0 {
		return fmt.Errorf("zmq: setsockopt %d: %w", opt, errnoOf(err))
	}
	return nil
}

// GetString reads a string option (LastEndpoint).
func (s *Socket) GetString(opt int) (string, error) {
	if err := s.live(); err != nil {
		return "", err
	}
	buf := make([]byte, 1024)
	n := C.size_t(len(buf))
	rc, err := C.cp_zmq_getsockopt(s.p, C.int(opt), unsafe.Pointer(&buf[0]), &n)
	if rc != 0 {
		return "", fmt.Errorf("zmq: getsockopt %d: %w", opt, errnoOf(err))
	}
	return cstr(buf[:n]), nil
}

// Bind binds the socket to ep.
func (s *Socket) Bind(ep string) error {
	if err := s.live(); err != nil {
		return err
	}
	cs := C.CString(ep)
	defer C.free(unsafe.Pointer(cs))
	if rc, err := C.cp_zmq_bind(s.p, cs); rc != 0 {
		return fmt.Errorf("zmq: bind %q: %w", ep, errnoOf(err))
	}
	return nil
}

// Connect connects the socket to ep (libzmq retries in the background).
func (s *Socket) Connect(ep string) error {
	if err := s.live(); err != nil {
		return err
	}
	cs := C.CString(ep)
	defer C.free(unsafe.Pointer(cs))
	if rc, err := C.cp_zmq_connect(s.p, cs); rc != 0 {
		return fmt.Errorf("zmq: connect %q: %w", ep, errnoOf(err))
	}
	return nil
}

// Send sends frames as one multipart message. flags may hold DontWait: libzmq then either
// queues the whole message or fails with EAGAIN (a full queue) or, on a ROUTER with
// RouterMandatory, EHOSTUNREACH (no such peer) on the first frame, having sent nothing.
func (s *Socket) Send(flags int, frames ...[]byte) error {
	if err := s.live(); err != nil {
		return err
	}
	for i, f := range frames {
		fl := flags
		if i < len(frames)-1 {
			fl |= SndMore
		}
		var p unsafe.Pointer
		if len(f) > 0 {
			p = unsafe.Pointer(&f[0])
		}
		for {
			rc, err := C.cp_zmq_send(s.p, p, C.size_t(len(f)), C.int(fl))
			if rc >= 0 {
				break
			}
			// A signal (the Go runtime's preemption signal among them) interrupts libzmq's
			// wait on its command mailbox; the frame was not taken, so it is sent again.
			if e := errnoOf(err); e != EINTR {
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
	for {
		var msg, data unsafe.Pointer
		var size C.size_t
		var more C.int
		rc, err := C.cp_zmq_recv_frame(s.p, C.int(flags), &msg, &data, &size, &more)
		if rc != 0 && errnoOf(err) == EINTR {
			continue // interrupted by a signal before a frame was taken: ask again
		}
		if rc != 0 {
			if len(frames) > 0 || dropped > 0 {
				// Frames of one message arrive together; a failure here is ETERM or the like.
				return frames, dropped, errnoOf(err)
			}
			return nil, 0, errnoOf(err)
		}
		if len(frames) < maxFrames {
			frames = append(frames, C.GoBytes(data, C.int(size)))
		} else {
			dropped++
		}
		C.cp_zmq_msg_free(msg)
		if more == 0 {
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
	c := (*C.cp_zmq_pollitem_t)(C.malloc(C.size_t(len(items)) * C.size_t(unsafe.Sizeof(C.cp_zmq_pollitem_t{}))))
	defer C.free(unsafe.Pointer(c))
	view := unsafe.Slice(c, len(items))
	for i, it := range items {
		if err := it.Socket.live(); err != nil {
			return 0, err
		}
		view[i] = C.cp_zmq_pollitem_t{socket: it.Socket.p, events: C.short(it.Events)}
	}
	n, err := C.cp_zmq_poll(c, C.int(len(items)), C.long(timeoutMs))
	if n < 0 && errnoOf(err) == EINTR {
		return 0, nil // a signal cut the wait short: as a timeout, the caller polls again
	}
	if n < 0 {
		return 0, errnoOf(err)
	}
	for i := range items {
		items[i].Ready = int(view[i].revents)
	}
	return int(n), nil
}

// Monitor asks libzmq to report s's events (a mask of Event*) on a PAIR socket bound to
// ep (an inproc:// name); MonitorEvent decodes what that socket receives.
func (s *Socket) Monitor(ep string, events int) error {
	if err := s.live(); err != nil {
		return err
	}
	cs := C.CString(ep)
	defer C.free(unsafe.Pointer(cs))
	if rc, err := C.cp_zmq_socket_monitor(s.p, cs, C.int(events)); rc != 0 {
		return fmt.Errorf("zmq: socket monitor on %q: %w", ep, errnoOf(err))
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
