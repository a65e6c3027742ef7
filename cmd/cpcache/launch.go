package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/internal/sigpipe"
	"github.com/cpcache/cpcache/parallel"
)

func init() {
	register(command{name: "launch", summary: "start N local ranks of a command (torchrun-style variables, a rendezvous store)", run: runLaunch})
}

// launchGrace is how long the other ranks get to exit after SIGTERM when one rank failed,
// before they are killed.
const launchGrace = 5 * time.Second

// launchExitGrace is how long a rank that has said it is exiting (its exit file, see
// envExitDir) may take to be reaped before launch leaves it behind: a thread of it stuck in
// the kernel (a frozen or hung file system) holds the process, SIGKILL included, until the
// kernel lets the thread go, while its work, and the job's, is over.
const launchExitGrace = 3 * time.Second

// envExitDir names the directory where a rank that is a cpcache process writes its exit
// status (exit-RANK) just before it exits (main, noteExit): the launcher that set it then
// knows the rank's status even if the kernel never lets the process end.
const envExitDir = "CPCACHE_LAUNCH_EXIT_DIR"

// envTestExitHang, set to a rank (tests only), makes that rank, once it wrote its exit
// file, never exit (SIGINT, SIGTERM and SIGHUP ignored): a process that a thread stuck in
// the kernel holds, as far as the launcher can tell until its reap.
const envTestExitHang = "CPCACHE_TEST_EXIT_HANG_RANK"

// launchDrain is how long a rank's output may keep flowing after it exited (from children
// it left behind) before launch stops reading it.
const launchDrain = 2 * time.Second

// launcherVars are the placement variables of every launcher, dropped from the children's
// environment so that parallel.FromEnv sees only the ones launch sets.
var launcherVars = parallel.LauncherVars()

func runLaunch(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("launch", "-n N [--store URL] -- COMMAND [ARGS...]",
		"Starts N processes of COMMAND on this machine with RANK, WORLD_SIZE, LOCAL_RANK,\n"+
			"LOCAL_WORLD_SIZE and CPCACHE_STORE set (the store defaults to a fresh temporary\n"+
			"directory, removed at the end). Each output line is prefixed with [rank].\n"+
			"SIGINT, SIGTERM and SIGHUP are forwarded to every rank, and launch then exits with\n"+
			"128+signal (130 for SIGINT, 129 for SIGHUP). When a rank fails the others get SIGTERM\n"+
			"(SIGKILL after 5s), and launch exits with the first failing rank's status (128+signal\n"+
			"for a rank killed by a signal). The ranks die with launch (kill -9 included), and its\n"+
			"temporary directory goes with the job. A rank that is a cpcache process writes its exit\n"+
			"status before it exits; one not reaped within 3s after that (a thread of it stuck in the\n"+
			"kernel: a frozen or hung file system) is left behind with a warning and counted with\n"+
			"that status. At most 256 local ranks.", stderr)
	n := fs.Int("n", 0, "number of ranks to start")
	store := fs.String("store", "", "rendezvous store URL (file:///dir or redis://host:port); default: a fresh temporary directory")
	if status, done := parseFlags(fs, args); done {
		return status
	}
	argv := fs.Args()
	if *n < 1 {
		return fail(stderr, 2, fmt.Errorf("launch: -n %d: need at least 1 rank", *n))
	}
	if err := checkLocalRanks("-n", *n); err != nil {
		return fail(stderr, 2, fmt.Errorf("launch: %w", err))
	}
	if len(argv) == 0 {
		return fail(stderr, 2, fmt.Errorf("launch: no command (usage: cpcache launch -n N -- COMMAND ARGS...)"))
	}
	if *store != "" {
		if err := gloo.CheckStore(context.Background(), *store); err != nil {
			return fail(stderr, 2, fmt.Errorf("launch: --store: %w", redact.Error(err, *store)))
		}
	}
	reclaimJobDirs()
	dir, done, err := newJobDir("launch")
	if err != nil {
		return fail(stderr, 1, fmt.Errorf("launch: job directory: %w", err))
	}
	defer done()
	exitDir, storeDir := filepath.Join(dir, "exit"), filepath.Join(dir, "store")
	for _, d := range []string{exitDir, storeDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(stderr, 1, fmt.Errorf("launch: %w", err))
		}
	}
	if *store == "" {
		*store = "file://" + storeDir
	}
	l := &launcher{n: *n, argv: argv, store: *store, exitDir: exitDir, stdout: &lineWriter{w: stdout}, stderr: &lineWriter{w: stderr}}
	return l.run()
}

// launcher runs one job of n local ranks.
type launcher struct {
	n              int
	argv           []string
	store          string
	stdout, stderr *lineWriter
	jobID          string // CPCACHE_JOB_ID of every rank: binds them to this job in the store
	// exitDir ("": none) is where the ranks write their exit status (envExitDir): a rank
	// that wrote it and is not reaped within exitGrace (0: launchExitGrace) is left behind.
	exitDir   string
	exitGrace time.Duration
	// wait reaps a rank (nil: cmd.Wait); tests make it never return, as for a process a
	// thread stuck in the kernel holds.
	wait func(*exec.Cmd) error

	mu        sync.Mutex     // protects everything below
	cmds      []*exec.Cmd    // started ranks, in rank order
	exited    []bool         // exited[r]: rank r was reaped (it gets no more signals)
	failed    int            // first failing rank, -1 while none
	status    int            // its exit status
	stopping  bool           // the ranks were told to stop
	signalled syscall.Signal // the first SIGINT, SIGTERM or SIGHUP received (0: none): the job's status is 128+signal
}

func (l *launcher) env(rank int) []string {
	env := make([]string, 0, len(os.Environ())+5)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(launcherVars, name) && name != envExitDir {
			env = append(env, kv)
		}
	}
	if l.exitDir != "" {
		env = append(env, envExitDir+"="+l.exitDir)
	}
	return append(env, "RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(l.n),
		"LOCAL_RANK="+strconv.Itoa(rank), "LOCAL_WORLD_SIZE="+strconv.Itoa(l.n), "CPCACHE_STORE="+l.store,
		parallel.EnvJobID+"="+l.jobID)
}

func (l *launcher) run() int {
	sigpipe.Catch() // a write to a broken stdout or stderr (the terminal gone after SIGHUP) fails with EPIPE instead of killing the launcher and, by Pdeathsig, its ranks
	// The ranks die with this process (Pdeathsig), which the kernel ties to the thread that
	// started them: keep that thread until every rank has exited.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sigs := make(chan os.Signal, 4)
	// SIGHUP (the terminal or the ssh session went away) too: by default it would end this
	// process at once, and the ranks with it by SIGKILL, without their handlers.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	l.failed = -1
	l.jobID = newJobID()
	exits := make(chan exit, l.n)
	l.exited = make([]bool, l.n)
	started := 0
	for r := 0; r < l.n; r++ {
		if len(sigs) > 0 {
			break // interrupted while starting: start no more ranks; the loop below forwards it
		}
		cmd := exec.Command(l.argv[0], l.argv[1:]...)
		cmd.Env = l.env(r)
		cmd.Stdin = nil
		// Each rank leads its own process group so that signals reach its children too, and
		// is killed if this process dies (kill -9 included), so no rank outlives its launcher.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		// Plain pipes (not StdoutPipe): Wait returns when the rank exits even if a child it
		// left behind still holds the write end; the output is drained separately.
		outR, outW, err1 := os.Pipe()
		errR, errW, err2 := os.Pipe()
		if err := errors.Join(err1, err2); err != nil {
			fmt.Fprintf(l.stderr, "launch: rank %d: %v\n", r, err)
			l.fail(r, 1)
			break
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		err := cmd.Start()
		outW.Close()
		errW.Close()
		if err != nil {
			outR.Close()
			errR.Close()
			fmt.Fprintf(l.stderr, "launch: start rank %d (%s): %v\n", r, l.argv[0], err)
			l.fail(r, 127)
			break
		}
		l.mu.Lock()
		l.cmds = append(l.cmds, cmd)
		l.mu.Unlock()
		started++
		drained := make(chan struct{}, 2)
		go func() { l.stdout.copyLines(r, outR); drained <- struct{}{} }()
		go func() { l.stderr.copyLines(r, errR); drained <- struct{}{} }()
		go func() {
			var err error
			if l.wait != nil {
				err = l.wait(cmd)
			} else {
				err = cmd.Wait()
			}
			// Let the output drain; a child the rank left behind that still holds the
			// pipes open is killed (with the rest of the rank's process group).
			timeout := time.After(launchDrain)
			for i := 0; i < 2; i++ {
				select {
				case <-drained:
				case <-timeout:
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					i = 2
				}
			}
			outR.Close()
			errR.Close()
			exits <- exit{r, err}
		}()
	}
	var stuck <-chan exit // ranks said they exited and were not reaped in time
	if l.exitDir != "" && started > 0 {
		ch := make(chan exit, l.n)
		stopWatch := make(chan struct{})
		defer close(stopWatch)
		go l.watchExits(started, ch, stopWatch)
		stuck = ch
	}
	for left := started; left > 0; {
		select {
		case e := <-exits:
			l.mu.Lock()
			gone := l.exited[e.rank] // left behind earlier
			l.exited[e.rank] = true
			l.mu.Unlock()
			if gone {
				continue
			}
			left--
			if st := exitStatus(e.err); st != 0 {
				l.fail(e.rank, st)
			}
		case e := <-stuck:
			l.mu.Lock()
			gone := l.exited[e.rank]
			if !gone {
				// It gets SIGKILL now (its process group), which ends it when the kernel
				// lets its thread go, and with Pdeathsig again when launch exits.
				_ = syscall.Kill(-l.cmds[e.rank].Process.Pid, syscall.SIGKILL)
				l.exited[e.rank] = true
			}
			l.mu.Unlock()
			if gone {
				continue
			}
			left--
			st := exitStatus(e.err)
			fmt.Fprintf(l.stderr, "launch: warning: rank %d exited with status %d but did not end within %v: a thread of it is stuck in the kernel (a frozen or hung file system?); leaving it behind\n",
				e.rank, st, l.grace())
			if st != 0 {
				l.fail(e.rank, st)
			}
		case s := <-sigs:
			fmt.Fprintf(l.stderr, "launch: got %v, forwarding it to every rank\n", s)
			l.signalAll(s.(syscall.Signal))
			// The ranks are shutting down on their own: a rank that exits non-zero now must
			// not cut the others' handlers short with SIGTERM; SIGKILL after the grace.
			l.mu.Lock()
			first := !l.stopping
			l.stopping = true
			if l.signalled == 0 {
				l.signalled = s.(syscall.Signal)
			}
			l.mu.Unlock()
			if first {
				time.AfterFunc(launchGrace, func() { l.signalAll(syscall.SIGKILL) })
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.signalled != 0 {
		return 128 + int(l.signalled)
	}
	if l.failed >= 0 {
		return l.status
	}
	return 0
}

func (l *launcher) grace() time.Duration {
	if l.exitGrace > 0 {
		return l.exitGrace
	}
	return launchExitGrace
}

// watchExits watches l.exitDir for the exit files of the first n ranks and sends on stuck,
// with its status, each rank that wrote one and is still not reaped l.grace() later, until
// stop is closed.
func (l *launcher) watchExits(n int, stuck chan<- exit, stop <-chan struct{}) {
	seen := make([]time.Time, n) // when rank r's exit file was first seen
	sent := make([]bool, n)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for r := 0; r < n; r++ {
			l.mu.Lock()
			gone := l.exited[r]
			l.mu.Unlock()
			if gone || sent[r] {
				continue
			}
			if seen[r].IsZero() {
				if _, err := os.Stat(exitPath(l.exitDir, r)); err == nil {
					seen[r] = time.Now()
				}
				continue
			}
			if time.Since(seen[r]) < l.grace() {
				continue
			}
			st, err := readExitFile(l.exitDir, r)
			if err != nil {
				st = 1
			}
			sent[r] = true
			stuck <- exit{r, statusError(st)}
		}
	}
}

// newJobID is a fresh job id: "<pid>-<random>", so that two jobs started at once on one
// store never share one.
func newJobID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// fail records rank's failure (the first one wins) and stops the other ranks.
func (l *launcher) fail(rank, status int) {
	l.mu.Lock()
	first := l.failed < 0
	if first {
		l.failed, l.status = rank, status
	}
	stopping := l.stopping
	l.stopping = true
	l.mu.Unlock()
	if first {
		fmt.Fprintf(l.stderr, "launch: rank %d failed with status %d; stopping the other ranks\n", rank, status)
	}
	if !stopping {
		l.signalAll(syscall.SIGTERM)
		time.AfterFunc(launchGrace, func() { l.signalAll(syscall.SIGKILL) })
	}
}

func (l *launcher) signalAll(sig syscall.Signal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, c := range l.cmds {
		if !l.exited[r] {
			_ = syscall.Kill(-c.Process.Pid, sig) // the rank's process group
		}
	}
}

// exit is a rank's end: its Wait error.
type exit struct {
	rank int
	err  error
}

// statusError is an error that exitStatus maps back to st (nil for 0).
type statusError int

func (e statusError) Error() string { return "exit status " + strconv.Itoa(int(e)) }

func exitPath(dir string, rank int) string { return filepath.Join(dir, "exit-"+strconv.Itoa(rank)) }

// readExitFile reads the status rank wrote into dir (noteExit).
func readExitFile(dir string, rank int) (int, error) {
	b, err := os.ReadFile(exitPath(dir, rank))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// noteExit runs just before a cpcache process exits with status: a rank of a launcher that
// set envExitDir writes its status there (through a rename: a reader never sees half of it).
// Under envTestExitHang (tests) that rank then never exits.
func noteExit(status int) {
	dir, rank := os.Getenv(envExitDir), os.Getenv("RANK")
	if dir == "" || rank == "" {
		return
	}
	if _, err := strconv.Atoi(rank); err != nil {
		return
	}
	path := filepath.Join(dir, "exit-"+rank)
	tmp := path + ".tmp"
	if os.WriteFile(tmp, []byte(strconv.Itoa(status)+"\n"), 0o600) == nil {
		_ = os.Rename(tmp, path)
	}
	if os.Getenv(envTestExitHang) == rank {
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		select {}
	}
}

// exitStatus maps a Wait error to a shell-style status.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	if st, ok := err.(statusError); ok {
		return int(st)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		if c := ee.ExitCode(); c > 0 {
			return c
		}
	}
	return 1
}

// lineWriter writes whole lines from many ranks to one writer.
type lineWriter struct {
	mu sync.Mutex // protects w: one line at a time
	w  io.Writer
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.Write(p)
}

// copyLines copies r to lw, prefixing each line with [rank]; a last line without a newline
// gets one.
func (lw *lineWriter) copyLines(rank int, r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	prefix := "[" + strconv.Itoa(rank) + "] "
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if !strings.HasSuffix(line, "\n") {
				line += "\n"
			}
			_, _ = lw.Write([]byte(prefix + line))
		}
		if err != nil {
			return
		}
	}
}
