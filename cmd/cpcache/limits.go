package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxLocalRanks bounds the ranks `cpcache run` and `cpcache launch` start on this machine:
// each is a process with its own runtime, threads, L1 pool and copy of the workload, so a
// few hundred already saturate a large host. Larger jobs span machines under mpirun or
// torchrun.
const maxLocalRanks = 256

// checkLocalRanks refuses, before any rank starts, a number of local ranks over
// maxLocalRanks or over what RLIMIT_NPROC leaves this user (each rank is at least one
// process; the limit also counts threads, so this is a lower bound of the need).
func checkLocalRanks(flag string, n int) error {
	if n > maxLocalRanks {
		return fmt.Errorf("%s %d: over the limit of %d local ranks (start larger jobs across machines with mpirun or torchrun)", flag, n, maxLocalRanks)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return nil
	}
	running := userProcesses()
	if uint64(n+running) > lim.Cur {
		return fmt.Errorf("%s %d: this user already runs %d processes and RLIMIT_NPROC (ulimit -u) allows %d", flag, n, running, lim.Cur)
	}
	return nil
}

// userProcesses counts the processes of this user (the owners of /proc/PID).
func userProcesses() int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	uid, n := uint32(os.Getuid()), 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name(), &st) == nil && st.Uid == uid {
			n++
		}
	}
	return n
}
