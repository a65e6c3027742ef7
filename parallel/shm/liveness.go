package shm

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// peerProc watches one peer process. A pidfd becomes readable when the process exits (even
// before its parent reaps it) and cannot be fooled by pid reuse; where pidfd_open is not
// available, kill(pid, 0) reporting ESRCH is the fallback.
type peerProc struct {
	pid int // 0: unknown or this process (in-process groups): never reported dead
	fd  int // pidfd, or -1
}

func watchPeer(pid int) peerProc {
	if pid <= 0 || pid == os.Getpid() {
		return peerProc{fd: -1}
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		fd = -1
	}
	return peerProc{pid: pid, fd: fd}
}

// exited reports whether the peer process is known to have exited.
func (p peerProc) exited() bool {
	if p.pid == 0 {
		return false
	}
	if p.fd >= 0 {
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
	}
	return errors.Is(unix.Kill(p.pid, 0), unix.ESRCH)
}

func (p *peerProc) close() {
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
}
