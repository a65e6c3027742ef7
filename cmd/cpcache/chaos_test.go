package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		child, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		if f := statFields(child); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// ranksOf lists the children of pid that are not session leaders: its ranks, not its
// janitor.
func ranksOf(pid int) []int {
	var out []int
	for _, c := range childrenOf(pid) {
		if sid, err := unix.Getsid(c); err == nil && sid != c {
			out = append(out, c)
		}
	}
	return out
}

// chaosArgs is a short job: 4 ranks in one CP group (host slabs and a shared-memory
// consensus group, so that kills land in their setup) serving a small workload in about a
// second.
var chaosArgs = append([]string{"run", "--world", "4", "--dp", "1", "--attn-cp", "4"}, smallSynthetic...)

// killTrial starts args, sends SIGKILL after delay to the launcher alone or to the whole job
// (the launcher's process group and every rank's), then requires that nothing is left:
// no process, no temporary directory, no /dev/shm segment.
func killTrial(t *testing.T, args []string, delay time.Duration, wholeJob bool) {
	t.Helper()
	j := newJobEnv(t)
	cmd := j.command(args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay)
	pid := cmd.Process.Pid
	if wholeJob {
		ranks := ranksOf(pid)
		syscall.Kill(-pid, syscall.SIGKILL)
		for _, r := range append(ranks, ranksOf(pid)...) {
			syscall.Kill(-r, syscall.SIGKILL) // a rank leads its own process group
			syscall.Kill(r, syscall.SIGKILL)  // one not yet in it
		}
	} else {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = cmd.Wait()
	what := fmt.Sprintf("%s killed after %v (whole job %v)", args[0], delay, wholeJob)
	j.requireNothingLeft(t, 3*time.Second, what)
}

// TestChaosKillNineLeavesNothing kills `cpcache run` with kill -9 at random moments (30
// trials of the whole job, most of them during rendezvous and slab setup; then the
// launcher alone, of run and of launch): no segment, process or temporary directory may be
// left. The segments are anonymous and the ranks die with their launcher by construction;
// the janitor removes the temporary directory.
func TestChaosKillNineLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills 35 jobs")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 15))
	for trial := range 30 {
		killTrial(t, chaosArgs, time.Duration(rng.Int64N(int64(700*time.Millisecond))), true)
		if t.Failed() {
			t.Fatalf("trial %d failed", trial)
		}
	}
	launchArgs := append([]string{"launch", "-n", "4", "--", cpcacheBinary(t)}, chaosArgs...)
	for trial := range 4 {
		args := chaosArgs
		if trial%2 == 1 {
			args = launchArgs
		}
		killTrial(t, args, time.Duration(200+rng.Int64N(400))*time.Millisecond, false)
	}
}

// TestCleanupReclaimsTheDirectoryOfAJobKilledWithItsJanitor: when the janitor dies too,
// `cpcache cleanup` (and the next run) remove the directory of the dead job, and leave the
// directory of a live one alone.
func TestCleanupReclaimsTheDirectoryOfAJobKilledWithItsJanitor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	j := newJobEnv(t)
	dead := j.command("launch", "-n", "1", "--", "sleep", "60")
	live := j.command("launch", "-n", "1", "--", "sleep", "60")
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer live.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for len(childrenOf(dead.Process.Pid)) < 2 || len(childrenOf(live.Process.Pid)) < 2 { // the rank and the janitor
		if time.Now().After(deadline) {
			t.Fatal("the jobs never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The janitor first, then the launcher (its rank dies with it): nobody is left to remove
	// the directory.
	for _, c := range childrenOf(dead.Process.Pid) {
		if sid, err := unix.Getsid(c); err == nil && sid == c {
			syscall.Kill(c, syscall.SIGKILL)
		}
	}
	syscall.Kill(dead.Process.Pid, syscall.SIGKILL)
	_ = dead.Wait()
	out, err := j.command("cleanup").Output()
	if err != nil {
		t.Fatal(err)
	}
	removed := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(removed) != 1 || !strings.Contains(removed[0], fmt.Sprintf("cpcache-launch-%d-", dead.Process.Pid)) {
		ents, _ := os.ReadDir(j.tmp)
		t.Fatalf("cleanup removed %q, want only the dead job's directory (%d); left: %v", out, dead.Process.Pid, ents)
	}
	live.Process.Kill()
	_ = live.Wait()
	j.requireNothingLeft(t, 3*time.Second, "the live job after it was killed")
}
