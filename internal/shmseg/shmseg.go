package shmseg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Segment is an anonymous shared-memory segment this process created and offers to its
// peers until Unshare.
type Segment struct {
	Mem    []byte // the creator's mapping; the caller unmaps it with unix.Munmap
	Handle string // what peers pass to Map: the abstract socket name that serves the memfd

	mu     sync.Mutex // protects fd and ln
	fd     int        // the memfd; -1 after Unshare
	ln     *net.UnixListener
	served chan struct{} // closed when the accept loop has returned
}

// handlePrefix starts every handle: abstract socket names are written with a leading '@'.
const handlePrefix = "@"

// Create makes an anonymous segment of size bytes (memfd_create) named name (seen only in
// /proc/PID/fd links), maps it shared read-write and starts offering it to peers of the same
// user at Handle. With reserve, the memory is allocated now (fallocate), so that a lack of
// memory fails here instead of raising SIGBUS at a later write. On failure nothing is left.
func Create(name string, size int, reserve bool) (seg *Segment, err error) {
	if size <= 0 {
		return nil, fmt.Errorf("segment %s: size %d must be positive", name, size)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create segment %s: memfd_create: %w", name, err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	sized := false
	if reserve {
		err := unix.Fallocate(fd, 0, 0, int64(size))
		if err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("allocate %d bytes for segment %s: %w", size, name, err)
		}
		sized = err == nil
	}
	if !sized {
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			return nil, fmt.Errorf("size segment %s to %d bytes: %w", name, size, err)
		}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map segment %s (%d bytes): %w", name, size, err)
	}
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("segment %s: socket name: %w", name, err)
	}
	handle := handlePrefix + name + "-" + hex.EncodeToString(nonce[:])
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: handle, Net: "unix"})
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("segment %s: listen on abstract socket %s: %w", name, handle, err)
	}
	seg = &Segment{Mem: mem, Handle: handle, fd: fd, ln: ln, served: make(chan struct{})}
	go seg.serve(ln, fd)
	return seg, nil
}

// serve hands fd to every peer of this user that connects, until the listener is closed.
// Connections are served one at a time, so fd stays open while it is being sent: Unshare
// closes it only after this loop has returned.
func (s *Segment) serve(ln *net.UnixListener, fd int) {
	defer close(s.served)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		if peerUID(c) == os.Getuid() {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _, _ = c.WriteMsgUnix([]byte{1}, unix.UnixRights(fd), nil)
		}
		c.Close()
	}
}

// Unshare stops offering the segment and closes its memfd: the memory lives on in every
// mapping and is freed by the kernel when the last one goes, so nothing can outlive the
// processes that use it. The mapping (Mem) stays valid. Nil-safe and idempotent.
func (s *Segment) Unshare() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	err := s.ln.Close()
	<-s.served
	s.ln = nil
	if cerr := unix.Close(s.fd); err == nil && cerr != nil {
		err = cerr
	}
	s.fd = -1
	if err != nil {
		return fmt.Errorf("unshare segment %s: %w", s.Handle, err)
	}
	return nil
}

// IsHandle reports whether handle has the form Create gives handles for name prefix.
func IsHandle(handle, prefix string) bool { return strings.HasPrefix(handle, handlePrefix+prefix) }

// Map receives the segment offered at handle by a process of this user (on this host, in
// this network namespace), checks that it is exactly size bytes and maps it shared
// read-write. It gives up when ctx ends.
func Map(ctx context.Context, handle string, size int) ([]byte, error) {
	if !strings.HasPrefix(handle, handlePrefix) {
		return nil, fmt.Errorf("segment handle %q is not an abstract socket name", handle)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", handle)
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w (the creator exited, or is on another host or network namespace)", handle, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	if uid := peerUID(c); uid != os.Getuid() {
		return nil, fmt.Errorf("open segment %s: served by user %d, not %d", handle, uid, os.Getuid())
	}
	var one [1]byte
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(one[:], oob)
	if err != nil {
		return nil, fmt.Errorf("open segment %s: receive: %w", handle, errors.Join(err, ctx.Err()))
	}
	fd, err := parseFD(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", handle, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat segment %s: %w", handle, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(size) {
		return nil, fmt.Errorf("segment %s has mode %#o size %d, want a regular file of %d bytes", handle, st.Mode, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map segment %s (%d bytes): %w", handle, size, err)
	}
	return mem, nil
}

// parseFD returns the single descriptor passed in a control message; any extra one is closed.
func parseFD(oob []byte) (int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1, fmt.Errorf("control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) == 0 {
		return -1, errors.New("no descriptor received (refused by the creator?)")
	}
	for _, extra := range fds[1:] {
		unix.Close(extra)
	}
	return fds[0], nil
}

// peerUID is the user id of the process at the other end of c, or -1 if unknown.
func peerUID(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	uid := -1
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			uid = int(cred.Uid)
		}
	})
	return uid
}
