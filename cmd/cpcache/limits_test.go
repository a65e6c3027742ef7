package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// v1MemoryCgroup makes a child of this process's cgroup v1 memory cgroup with a memory
// limit, removed at the end of the test; it skips, saying why, where there is no writable
// cgroup v1 memory hierarchy.
func v1MemoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	var path string
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) == 3 && hasWord(parts[1], "memory") {
			path = parts[2]
		}
	}
	parent := filepath.Join("/sys/fs/cgroup/memory", path)
	if path == "" {
		t.Skip("this host has no cgroup v1 memory controller (cgroup v2 only)")
	}
	if _, err := os.Stat(filepath.Join(parent, "memory.limit_in_bytes")); err != nil {
		t.Skipf("this process's cgroup v1 memory cgroup is not at %s: %v", parent, err)
	}
	dir := filepath.Join(parent, "cpcache-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup v1 memory cgroup (needs root and a writable hierarchy): %v", err)
	}
	t.Cleanup(func() {
		// The cgroup empties once its processes are reaped; a removal races their exit.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				return
			}
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Skipf("cannot set a cgroup v1 memory limit: %v", err)
	}
	return dir
}

func hasWord(list, w string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == w {
			return true
		}
	}
	return false
}

// TestRunRefusesOverACgroupV1MemoryLimit: `cpcache run` in a cgroup v1 memory cgroup whose
// limit is below what its 16 ranks need is refused before any rank starts (exit 2, naming
// the limit's file and cgroup): ranks started over the limit are OOM-killed (exit 137).
// The limit is read from cgroup v1's memory.limit_in_bytes, not only v2's memory.max.
func TestRunRefusesOverACgroupV1MemoryLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	dir := v1MemoryCgroup(t, 256<<20)
	j := newJobEnv(t)
	// The shell joins the cgroup, then becomes cpcache: every rank would be in it.
	cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2" run --clients 32 --rounds 4`, "sh", dir, j.path)
	cmd.Env = j.env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if status, err := waitExit(t, cmd, 60*time.Second, &stderr); status != 2 {
		t.Fatalf("%v, want exit status 2; stderr:\n%s", err, stderr.String())
	}
	want := "of memory available (cgroup memory.limit_in_bytes of "
	if errOut := stderr.String(); !strings.Contains(errOut, want) || strings.Contains(errOut, "starting") {
		t.Errorf("stderr %q: want one line containing %q, no rank started", errOut, want)
	}
	j.requireNothingLeft(t, 2*time.Second, "run over a cgroup v1 limit")
}

// TestCheckThreads: the RLIMIT_NPROC check counts threads, as Linux does: 16 ranks of 10
// threads (and the launcher's one per rank) beside 5 running threads need 181 > 120. The
// old check counted 16 processes + 5 and let them start, and the ranks failed to make their
// threads.
func TestCheckThreads(t *testing.T) {
	err := checkThreads("--world", 16, 10, 5, 120)
	if err == nil {
		t.Fatal("16 ranks of 10 threads fit under ulimit -u 120")
	}
	for _, want := range []string{"--world 16", "176 threads", "10 per rank", "already runs 5 threads", "RLIMIT_NPROC (ulimit -u) allows 120"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if err := checkThreads("-n", 8, 10, 5, 120); err != nil {
		t.Errorf("8 ranks (93 threads) under 120: %v", err)
	}
	if err := checkThreads("-n", 10, 10, 10, 120); err != nil {
		t.Errorf("exactly at the limit: %v", err)
	}
}

func TestStatusUidThreads(t *testing.T) {
	status := "Name:\tcpcache\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\nThreads:\t23\n"
	uid, threads, ok := statusUidThreads([]byte(status))
	if !ok || uid != "1000" || threads != 23 {
		t.Errorf("statusUidThreads = %q, %d, %v; want the real uid 1000 and 23 threads", uid, threads, ok)
	}
	if _, _, ok := statusUidThreads([]byte("Name:\tx\n")); ok {
		t.Error("a status without Uid and Threads is ok")
	}
	// This process alone runs several threads (the Go runtime's): userThreads counts them.
	_, self, _ := statusUidThreads(must(os.ReadFile("/proc/self/status")))
	if n := userThreads(); self < 2 || n < self {
		t.Errorf("userThreads() = %d, this process alone runs %d", n, self)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// nprocUser returns how to run a command under an RLIMIT_NPROC the kernel enforces: as this
// user when it is not exempt, else (root) as nobody, with a copy of the binary and a
// temporary directory that user can use; it skips, saying why, where neither works.
func nprocUser(t *testing.T) (bin, tmp string, cred *syscall.Credential) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash for ulimit -u")
	}
	bin, tmp = cpcacheBinary(t), t.TempDir()
	if !exemptFromNproc() {
		return bin, tmp, nil
	}
	if os.Getuid() != 0 {
		t.Skip("this process has CAP_SYS_ADMIN or CAP_SYS_RESOURCE (RLIMIT_NPROC is not enforced) and cannot run as another user")
	}
	// Root ignores RLIMIT_NPROC: run as nobody, from a directory nobody can read.
	dir, err := os.MkdirTemp("", "cpcache-nproc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	tmp = filepath.Join(dir, "tmp")
	if err := errors.Join(os.Chmod(dir, 0o755), os.Mkdir(tmp, 0o700), os.Chown(tmp, 65534, 65534)); err != nil {
		t.Fatal(err)
	}
	copyBin := filepath.Join(dir, "cpcache")
	if err := os.WriteFile(copyBin, must(os.ReadFile(bin)), 0o755); err != nil {
		t.Fatal(err)
	}
	return copyBin, tmp, &syscall.Credential{Uid: 65534, Gid: 65534}
}

// TestLocalRanksRespectRLIMITNPROC: under `ulimit -u 120`, `cpcache run --world 16` and
// `cpcache launch -n 16` are refused before any rank starts (exit 2, naming the limit), and
// a job that fits (4 ranks) runs under the same limit. Linux counts threads, not processes,
// against the limit: 17 processes fit in 120, their threads do not, and ranks started so
// would fail with "Resource temporarily unavailable".
func TestLocalRanksRespectRLIMITNPROC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	bin, tmp, cred := nprocUser(t)
	ulimited := func(args ...string) (int, string) {
		cmd := exec.Command("bash", append([]string{"-c", `ulimit -u 120 && exec "$@"`, "bash", bin}, args...)...)
		cmd.Env = append(withoutLauncherEnv(func(name string) bool { return name == "TMPDIR" || strings.HasPrefix(name, "CPCACHE_") }), "TMPDIR="+tmp)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = tmp
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
		defer timer.Stop()
		err := cmd.Wait()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String()
	}
	for _, args := range [][]string{{"run", "--world", "16"}, {"launch", "-n", "16", "--", "true"}} {
		status, out := ulimited(args...)
		if status != 2 || !strings.Contains(out, "RLIMIT_NPROC (ulimit -u) allows 120") || strings.Contains(out, "starting") {
			t.Errorf("%v under ulimit -u 120: exit %d, want 2 naming the limit before any rank starts:\n%s", args, status, out)
		}
	}
	status, out := ulimited(append([]string{"run", "--world", "4", "--dp", "1", "--attn-cp", "4"}, smallSynthetic...)...)
	if status != 0 || !strings.Contains(out, "cpcache run report") {
		t.Errorf("4 ranks under ulimit -u 120: exit %d, want 0:\n%s", status, out)
	}
}

// refusedAtOnce runs the binary with args and asserts exit status 2 within 10 s (a blocked
// open would wait forever: the process is killed then), one line of stderr containing want,
// and no rank started.
func refusedAtOnce(t *testing.T, j *jobEnv, want string, args ...string) {
	t.Helper()
	cmd := j.command(args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(10*time.Second, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	if !timer.Stop() {
		t.Errorf("%v: still waiting after 10 s (killed)", args)
		return
	}
	var ee *exec.ExitError
	errOut := stderr.String()
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("%v: %v, want exit status 2; stderr:\n%s", args, err, errOut)
	}
	if lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n"); len(lines) != 1 || !strings.Contains(errOut, want) {
		t.Errorf("%v: stderr %q, want one line containing %q", args, errOut, want)
	}
	if strings.Contains(errOut, "starting") || stdout.Len() > 0 {
		t.Errorf("%v: a rank started: %q %q", args, stdout.String(), errOut)
	}
}

// TestRunRefusesNonRegularFilesAtOnce: a named pipe (with or without a peer), a directory or
// a device given as --trace, --cost-profile, --json or --html is refused at once (exit 2,
// naming the path and its kind): a plain open of a FIFO without a writer (--trace) or
// without a reader (--json) would wait forever.
func TestRunRefusesNonRegularFilesAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	j := newJobEnv(t)
	pipe := fifo + ": not a regular file (a named pipe)"
	refusedAtOnce(t, j, "--trace", "run", "--workload", "trace", "--trace", fifo)
	refusedAtOnce(t, j, pipe, "run", "--workload", "trace", "--trace", fifo)
	refusedAtOnce(t, j, dir+": not a regular file (a directory)", "run", "--workload", "trace", "--trace", dir)
	refusedAtOnce(t, j, "--json "+pipe, "run", "--json", fifo)
	refusedAtOnce(t, j, "--html "+pipe, "run", "--html", fifo)
	refusedAtOnce(t, j, pipe, "run", "--cost-profile", fifo)
	refusedAtOnce(t, j, "--json /dev/zero: not a regular file (a character device)", "run", "--json", "/dev/zero")
	// A reader on the pipe does not make it a report file either (it would take the report
	// that belongs in a file, and block the rank writing it while the reader stalls).
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	refusedAtOnce(t, j, "--json "+pipe, "run", "--json", fifo)
	// A writer on the pipe does not make it a trace.
	w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	refusedAtOnce(t, j, pipe, "run", "--workload", "trace", "--trace", fifo)
}

// TestRunRefusesSpeedsThatMeanNothing: --speed 0 was silently 1, and a --speed without
// virtual time silently did nothing; both are bad input naming the value.
func TestRunRefusesSpeedsThatMeanNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	j := newJobEnv(t)
	for _, v := range []string{"0", "-0", "-2", "NaN", "+Inf"} {
		refusedAtOnce(t, j, "--speed "+v+": must be a positive number", "run", "--time", "virtual", "--speed", v)
	}
	refusedAtOnce(t, j, "--speed 10 needs --time virtual", "run", "--speed", "10")
	refusedAtOnce(t, j, "--speed 10 needs --time virtual", "run", "--time", "none", "--workload", "trace", "--trace", "x.jsonl", "--speed", "10")
}

// TestOutputStreamsStayWritable: the standard streams and /dev/null are the documented
// exceptions to "a report file is a regular file".
func TestOutputStreamsStayWritable(t *testing.T) {
	for _, p := range []string{"/dev/null", "/dev/stderr"} {
		if err := checkOutputFile("--json", p); err != nil {
			t.Errorf("checkOutputFile(%s): %v", p, err)
		}
	}
	p := filepath.Join(t.TempDir(), "r.json")
	if err := checkOutputFile("--json", p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the check left the file it created: %v", err)
	}
}

// TestSIGHUPIsForwarded: SIGHUP to `cpcache launch` reaches every rank, whose handler runs,
// and launch exits with 129; `cpcache run` (alone, or as the ranks of a launch) ends on
// SIGHUP as on SIGTERM: exit 129, nothing left behind. SIGHUP's default action would end
// launch (and run) on the spot and the ranks by SIGKILL (Pdeathsig), their handlers unrun.
func TestSIGHUPIsForwarded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	trap := `trap 'echo got-hup; exit 7' HUP; echo ready; while :; do sleep 0.1; done`
	work := []string{"run", "--world", "2", "--dp", "1", "--attn-cp", "2", "--clients", "64", "--rounds", "12"}
	cases := []struct {
		name  string
		args  []string
		ready func(j *jobEnv, stdout string) bool
	}{
		{"launch of shells", []string{"launch", "-n", "2", "--", "sh", "-c", trap},
			func(_ *jobEnv, stdout string) bool { return strings.Count(stdout, "ready") == 2 }},
		{"run", work, func(j *jobEnv, _ string) bool { return j.processes() >= 3 }},
		{"launch of run", append([]string{"launch", "-n", "2", "--", cpcacheBinary(t)}, work...),
			func(j *jobEnv, _ string) bool { return j.processes() >= 3 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := newJobEnv(t)
			cmd := j.command(c.args...)
			var stdout, stderr syncBuffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(30 * time.Second); !c.ready(j, stdout.String()); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					_ = cmd.Process.Kill()
					t.Fatalf("never started:\n%s", stderr.String())
				}
			}
			time.Sleep(300 * time.Millisecond)
			if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			if status, err := waitExit(t, cmd, 30*time.Second, &stderr); status != 129 {
				t.Fatalf("after SIGHUP: %v, want exit status 129 (128+SIGHUP); stderr:\n%s", err, stderr.String())
			}
			if c.name == "launch of shells" {
				if n := strings.Count(stdout.String(), "got-hup"); n != 2 {
					t.Errorf("%d ranks ran their SIGHUP handler, want 2:\n%s", n, stdout.String())
				}
			}
			j.requireNothingLeft(t, 2*time.Second, c.name+" after SIGHUP")
		})
	}
}

// TestSIGHUPWithBrokenOutput: after SIGHUP the terminal is usually gone, and the launcher's
// stdout and stderr are broken pipes: its own message and the ranks' output it copies get
// EPIPE, which must not kill it by SIGPIPE (its ranks would then die by SIGKILL, without
// their handlers). cpcache launch and cpcache run still forward the signal and exit 129.
func TestSIGHUPWithBrokenOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	marks := t.TempDir()
	// Each rank says it is ready, and that it got SIGHUP, in files and on its stdout (which
	// the launcher copies to its broken stdout).
	trap := `trap 'echo got-hup >> "$MARKS/hup.$RANK"; echo got-hup; exit 7' HUP; : > "$MARKS/ready.$RANK"; ` +
		`while :; do echo tick; sleep 0.05; done`
	work := []string{"run", "--world", "2", "--dp", "1", "--attn-cp", "2", "--clients", "64", "--rounds", "12"}
	cases := []struct {
		name  string
		args  []string
		ready func(j *jobEnv) bool
	}{
		{"launch of shells", []string{"launch", "-n", "2", "--", "sh", "-c", trap}, func(*jobEnv) bool {
			m, _ := filepath.Glob(filepath.Join(marks, "ready.*"))
			return len(m) == 2
		}},
		{"run", work, func(j *jobEnv) bool { return j.processes() >= 3 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := newJobEnv(t)
			cmd := j.command(c.args...)
			cmd.Env = append(cmd.Env, "MARKS="+marks)
			outR, outW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			errR, errW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout, cmd.Stderr = outW, errW
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			outW.Close()
			errW.Close()
			for deadline := time.Now().Add(30 * time.Second); !c.ready(j); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					_ = cmd.Process.Kill()
					t.Fatal("never started")
				}
			}
			time.Sleep(300 * time.Millisecond)
			outR.Close() // the terminal is gone
			errR.Close()
			if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			if status, err := waitExit(t, cmd, 30*time.Second, new(strings.Builder)); status != 129 {
				t.Fatalf("after SIGHUP with broken stdout and stderr: %v, want exit status 129 (128+SIGHUP), not death by SIGPIPE", err)
			}
			if c.name == "launch of shells" {
				for r := 0; r < 2; r++ {
					if _, err := os.Stat(filepath.Join(marks, fmt.Sprintf("hup.%d", r))); err != nil {
						t.Errorf("rank %d did not run its SIGHUP handler: %v", r, err)
					}
				}
			}
			j.requireNothingLeft(t, 2*time.Second, c.name+" after SIGHUP")
		})
	}
}

// TestRanksStartedWithDifferentFlagsFailAtOnce: ranks of one replica started (by a wrapper
// that reads RANK) with different --max-running, --clients, --requests, --isolation or
// --turn-gap, or reading different traces, all fail at start with exit 2 naming what differs and both values,
// within 30 s, instead of making different scheduler decisions and waiting for each other's
// collectives until the 60 s step deadline, then reporting a timeout naming no flag.
func TestRanksStartedWithDifferentFlagsFailAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	dir := t.TempDir()
	for r, id := range []string{"1", "2"} {
		line := `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [` + id + `, 3]}`
		if err := os.WriteFile(filepath.Join(dir, "trace"+strconv.Itoa(r)+".jsonl"), []byte(line+"\n"+line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct{ name, perRank, want string }{
		{"max-running", `--max-running $((1 + 3 * RANK))`, "--max-running differs between the ranks of the job: 1 on rank 0, 4 on rank 1"},
		{"clients", `--clients $((8 - RANK))`, "--clients differs between the ranks of the job: 8 on rank 0, 7 on rank 1"},
		{"requests", `--requests $((RANK * 5))`, "--requests differs between the ranks of the job: 0 on rank 0, 5 on rank 1"},
		{"trace", `--workload trace --trace ` + dir + `/trace$RANK.jsonl`, "the workload's requests (trace) differs between the ranks of the job: 2 requests (digest "},
		// Different isolation keys build different trees: the ranks used to run, diverge and
		// recover 4 times, then exit 1.
		{"isolation", `--isolation $([ "$RANK" = 1 ] && echo per-client || echo none)`, "--isolation differs between the ranks of the job: none on rank 0, per-client on rank 1"},
		{"turn-gap", `--turn-gap $((RANK * 2))s`, "--turn-gap differs between the ranks of the job: 0s on rank 0, 2s on rank 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := newJobEnv(t)
			script := `exec "$0" run --dp 1 --attn-cp 2 --clients 8 --rounds 4 ` + c.perRank
			cmd := j.command("launch", "-n", "2", "--", "sh", "-c", script, j.path)
			var stdout, stderr syncBuffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if status, err := waitExit(t, cmd, 30*time.Second, &stderr); status != 2 {
				t.Fatalf("%v, want exit status 2; stderr:\n%s", err, stderr.String())
			}
			for _, rank := range []string{"[0] ", "[1] "} {
				if !strings.Contains(stderr.String(), rank+"cpcache: run: runner: bad input: "+c.want) {
					t.Errorf("rank %s does not say %q:\n%s", rank, c.want, stderr.String())
				}
			}
			if strings.Contains(stdout.String(), "cpcache run report") {
				t.Errorf("a report was printed:\n%s", stdout.String())
			}
			j.requireNothingLeft(t, 2*time.Second, "ranks with different flags")
		})
	}
}

// waitExit waits for the started cmd, at most d, and returns its exit status (-1 when it
// did not exit) and Wait's error. Past d it gets SIGTERM (SIGKILL 5 s later), and once it
// has exited the test fails showing stderr.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration, stderr fmt.Stringer) (int, error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		kill := time.AfterFunc(5*time.Second, func() { _ = cmd.Process.Kill() })
		<-done
		kill.Stop()
		t.Fatalf("%v: still running after %v:\n%s", cmd.Args, d, stderr)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return -1, err
	}
	return cmd.ProcessState.ExitCode(), err
}
