package shm

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// hello is what each member sends the others over the bootstrap group at creation.
type hello struct {
	mode  string // the consensus backend this member asked for: auto, shm or gloo
	pid   int
	err   string // why this member cannot take part (bad options), if it cannot
	idErr string // why this member could not determine its host identity, if it could not
	// host identity: members can share a segment only when all of these are equal.
	host, boot, netns, pidns, shmdir string
}

// identityFields name the host identity in comparison order.
var identityFields = []string{"host", "boot", "netns", "pidns", "shmdir"}

func (h hello) field(name string) string {
	switch name {
	case "host":
		return h.host
	case "boot":
		return h.boot
	case "netns":
		return h.netns
	case "pidns":
		return h.pidns
	case "shmdir":
		return h.shmdir
	}
	return ""
}

// localHello describes this process: hostname, kernel boot id, network and pid namespace
// inodes, and the device and inode of the segment directory (two members see the same
// filesystem there only if these agree).
func localHello(mode, dir string) hello {
	h := hello{mode: mode, pid: os.Getpid()}
	var errs []string
	var err error
	if h.host, err = os.Hostname(); err != nil {
		errs = append(errs, fmt.Sprintf("hostname: %v", err))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.boot = strings.TrimSpace(string(b))
	} else {
		errs = append(errs, fmt.Sprintf("boot id: %v", err))
	}
	if h.netns, err = nsInode("net"); err != nil {
		errs = append(errs, err.Error())
	}
	if h.pidns, err = nsInode("pid"); err != nil {
		errs = append(errs, err.Error())
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		errs = append(errs, fmt.Sprintf("segment directory %s: %v", dir, err))
	} else if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		errs = append(errs, fmt.Sprintf("segment directory %s is not a directory", dir))
	} else {
		h.shmdir = fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	}
	h.idErr = strings.Join(errs, "; ")
	return h
}

func nsInode(kind string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/"+kind, &st); err != nil {
		return "", fmt.Errorf("%s namespace: %v", kind, err)
	}
	return strconv.FormatUint(st.Ino, 10), nil
}

func (h hello) encode() []byte {
	return fmt.Appendf(nil, "shm-hello-v1\nmode=%s\npid=%d\nhost=%s\nboot=%s\nnetns=%s\npidns=%s\nshmdir=%s\nerr=%s\niderr=%s\n",
		h.mode, h.pid, oneLine(h.host), h.boot, h.netns, h.pidns, h.shmdir, oneLine(h.err), oneLine(h.idErr))
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func decodeHello(b []byte) (hello, error) {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) == 0 || lines[0] != "shm-hello-v1" {
		return hello{}, fmt.Errorf("not a shm hello message (%.40q)", b)
	}
	var h hello
	for _, line := range lines[1:] {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return hello{}, fmt.Errorf("bad line %q in hello message", line)
		}
		switch k {
		case "mode":
			h.mode = v
		case "pid":
			pid, err := strconv.Atoi(v)
			if err != nil {
				return hello{}, fmt.Errorf("bad pid %q in hello message", v)
			}
			h.pid = pid
		case "host":
			h.host = v
		case "boot":
			h.boot = v
		case "netns":
			h.netns = v
		case "pidns":
			h.pidns = v
		case "shmdir":
			h.shmdir = v
		case "err":
			h.err = v
		case "iderr":
			h.idErr = v
		}
	}
	return h, nil
}

// sameHost returns nil when every member has member 0's host identity, else an error
// naming the first member that could not determine its identity, or the first member and
// field that differ.
func sameHost(hs []hello) error {
	for r, h := range hs {
		if h.idErr != "" {
			return fmt.Errorf("%w: member %d cannot tell its host identity: %s", ErrNotLocal, r, h.idErr)
		}
	}
	for r := 1; r < len(hs); r++ {
		for _, f := range identityFields {
			if a, b := hs[0].field(f), hs[r].field(f); a != b {
				return fmt.Errorf("%w: member 0 has %s=%s, member %d has %s=%s", ErrNotLocal, f, a, r, f, b)
			}
		}
	}
	return nil
}
