package main

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLocalRanks bounds the ranks `cpcache run` and `cpcache launch` start on this machine:
// each is a process with its own runtime, threads, L1 pool and copy of the workload, so a
// few hundred already saturate a large host. Larger jobs span machines under mpirun or
// torchrun.
const maxLocalRanks = 256

// rankThreadsBase and one more per GOMAXPROCS are the threads a rank needs: Linux counts
// every thread (task) of a user against RLIMIT_NPROC, not processes. Measured on a 2-core
// host (GOMAXPROCS 2), a rank of `cpcache run` runs 9 threads (shared-memory consensus) to 10
// (Gloo consensus): the Go runtime's (sysmon, one per P, spares for blocking calls) and
// Gloo's; the Go runtime adds one per P on larger hosts. The launcher itself needs about the
// same plus one per rank (a thread blocked waiting for each rank's exit). It is a lower bound:
// a CUDA driver adds its own threads.
const rankThreadsBase = 8

// threadsPerRank is the threads one local rank needs at least (rankThreadsBase).
func threadsPerRank() int { return rankThreadsBase + runtime.GOMAXPROCS(0) }

// nprocLimit says how many tasks RLIMIT_NPROC lets this user run (enforced false: no limit,
// or the kernel does not enforce it for this process: it has CAP_SYS_ADMIN or
// CAP_SYS_RESOURCE, as root does).
type nprocLimit struct {
	limit    uint64
	enforced bool
}

// currentNprocLimit reads RLIMIT_NPROC and whether the kernel enforces it here.
func currentNprocLimit() nprocLimit {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return nprocLimit{}
	}
	return nprocLimit{limit: lim.Cur, enforced: !exemptFromNproc()}
}

// exemptFromNproc reports whether this process's effective capabilities include
// CAP_SYS_ADMIN or CAP_SYS_RESOURCE, with which fork and clone ignore RLIMIT_NPROC.
func exemptFromNproc() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_ADMIN|1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}

// checkLocalRanks refuses, before any rank starts, a number of local ranks over
// maxLocalRanks or over what RLIMIT_NPROC leaves this user.
func checkLocalRanks(flag string, n int) error {
	if n > maxLocalRanks {
		return fmt.Errorf("%s %d: over the limit of %d local ranks (start larger jobs across machines with mpirun or torchrun)", flag, n, maxLocalRanks)
	}
	lim := currentNprocLimit()
	if !lim.enforced {
		return nil
	}
	return checkThreads(flag, n, threadsPerRank(), userThreads(), lim.limit)
}

// checkThreads is checkLocalRanks's arithmetic: n ranks of perRank threads each, and the
// launcher's one per rank, beside the running threads the user already runs, within limit.
func checkThreads(flag string, n, perRank, running int, limit uint64) error {
	need := n*perRank + n
	if uint64(need+running) > limit {
		return fmt.Errorf("%s %d: %d local ranks need about %d threads (%d per rank, and the launcher's), this user already runs %d threads, and RLIMIT_NPROC (ulimit -u) allows %d (Linux counts threads against it)",
			flag, n, n, need, perRank, running, limit)
	}
	return nil
}

// userThreads counts the threads (tasks) of the processes whose real user is this
// process's, as the kernel does for RLIMIT_NPROC: the Threads of every /proc/PID/status
// whose Uid line's first field (the real uid) is ours.
func userThreads() int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	uid, n := strconv.Itoa(os.Getuid()), 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		if real, threads, ok := statusUidThreads(b); ok && real == uid {
			n += threads
		}
	}
	return n
}

// statusUidThreads reads the real uid and the thread count of a /proc/PID/status.
func statusUidThreads(status []byte) (uid string, threads int, ok bool) {
	var haveUID, haveThreads bool
	for line := range bytes.Lines(status) {
		s := string(line)
		if rest, found := strings.CutPrefix(s, "Uid:"); found {
			if f := strings.Fields(rest); len(f) > 0 {
				uid, haveUID = f[0], true
			}
		} else if rest, found := strings.CutPrefix(s, "Threads:"); found {
			if t, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
				threads, haveThreads = t, true
			}
		}
	}
	return uid, threads, haveUID && haveThreads
}
