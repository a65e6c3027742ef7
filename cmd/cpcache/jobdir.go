package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// jobDirRE matches the temporary directories of `cpcache run` and `cpcache launch`:
// cpcache-KIND-PID-RANDOM, PID being the process that created it.
var jobDirRE = regexp.MustCompile(`^cpcache-(run|launch)-([0-9]+)-[0-9]+$`)

// newJobDir creates a private temporary directory for one job, named after this process so
// that reclaimJobDirs can tell when its creator is gone, and starts a janitor: a shell
// outside the job's process groups that waits for this process to close a pipe and then
// removes the directory. So the directory goes when the job ends, also when this process
// is killed (kill -9 included) and its ranks with it. done removes the directory and
// releases the janitor; call it once the ranks have exited.
func newJobDir(kind string) (dir string, done func(), err error) {
	// The janitor starts before the directory exists, so that no moment has one without
	// the other.
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", nil, err
	}
	dir = filepath.Join(os.TempDir(), fmt.Sprintf("cpcache-%s-%d-%d", kind, os.Getpid(), binary.LittleEndian.Uint64(nonce[:])>>1))
	r, w, err := os.Pipe()
	if err != nil {
		return "", nil, err
	}
	janitor := exec.Command("/bin/sh", "-c", `while read -r _; do :; done; rm -rf -- "$1"`, "cpcache-janitor", dir)
	janitor.Stdin = r
	// Its own session: a signal to the job's process group (Ctrl-C, kill -9 -PGID) does not
	// reach it.
	janitor.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	jerr := janitor.Start()
	r.Close()
	done = func() {
		os.RemoveAll(dir)
		w.Close()
		if jerr == nil {
			_ = janitor.Wait()
		}
	}
	// Without a janitor (no /bin/sh) done still removes the directory, and after a crash the
	// next run or `cpcache cleanup` does.
	if err := os.Mkdir(dir, 0o700); err != nil {
		// Not ours (or not made): the janitor must not remove what is there.
		if jerr == nil {
			_ = janitor.Process.Kill()
			_ = janitor.Wait()
		}
		w.Close()
		return "", nil, err
	}
	// The pid in the name means this process only in this pid namespace: record which one.
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(pidNamespace()), 0o600); err != nil {
		done()
		return "", nil, err
	}
	return dir, done, nil
}

// ownerFile, in a job directory, holds the pid namespace of its creator.
const ownerFile = ".cpcache-owner"

// pidNamespace identifies this process's pid namespace ("" if unknown).
func pidNamespace() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

// reclaimJobDirs removes the job directories of this user in the temporary directory whose
// creator is gone (a crash the janitor did not survive either), and returns them. Only
// directories created in this pid namespace are judged; others are left alone.
func reclaimJobDirs() []string {
	tmp := os.TempDir()
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range ents {
		m := jobDirRE.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		path := filepath.Join(tmp, e.Name())
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil || st.Uid != uint32(os.Getuid()) {
			continue
		}
		owner, err := os.ReadFile(filepath.Join(path, ownerFile))
		if err != nil || string(owner) == "" || string(owner) != pidNamespace() {
			continue
		}
		pid, _ := strconv.Atoi(m[2])
		if creatorAlive(pid, time.Unix(st.Mtim.Unix())) {
			continue
		}
		if os.RemoveAll(path) == nil {
			removed = append(removed, path)
		}
	}
	return removed
}

// creatorAlive reports whether pid may still be the process that created a directory last
// modified at mtime: it exists and started before then. A process that started later is a
// reuse of the pid. When unsure it says alive.
func creatorAlive(pid int, mtime time.Time) bool {
	if err := unix.Kill(pid, 0); err == unix.ESRCH {
		return false
	}
	start, ok := processStart(pid)
	return !ok || !start.After(mtime.Add(time.Second))
}

// statFields are the fields of /proc/PID/stat after the command name, from field 3 (the
// state) on; nil when unreadable. The command name may hold spaces and parentheses: the
// fields start after its last ')'.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// processStart is when pid started, from /proc/PID/stat (field 22, clock ticks after boot)
// and the boot time in /proc/stat.
func processStart(pid int) (time.Time, bool) {
	f := statFields(pid)
	if len(f) < 20 {
		return time.Time{}, false
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, false
			}
			const clockTicks = 100 // USER_HZ on Linux
			return time.Unix(boot, 0).Add(time.Duration(ticks) * time.Second / clockTicks), true
		}
	}
	return time.Time{}, false
}
