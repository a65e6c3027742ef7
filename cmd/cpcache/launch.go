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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/parallel"
)

func init() {
	register(command{name: "launch", summary: "start N local ranks of a command (torchrun-style variables, a rendezvous store)", run: runLaunch})
}

// launchGrace is how long the other ranks get to exit after SIGTERM when one rank failed,
// before they are killed.
const launchGrace = 5 * time.Second

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
			"temporary directory goes with the job. At most 256 local ranks.", stderr)
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
	if *store == "" {
		dir, done, err := newJobDir("launch")
		if err != nil {
			return fail(stderr, 1, fmt.Errorf("launch: store directory: %w", err))
		}
		defer done()
		*store = "file://" + dir
	}
	l := &launcher{n: *n, argv: argv, store: *store, stdout: &lineWriter{w: stdout}, stderr: &lineWriter{w: stderr}}
	return l.run()
}

// launcher runs one job of n local ranks.
type launcher struct {
	n              int
	argv           []string
	store          string
	stdout, stderr *lineWriter
	jobID          string // CPCACHE_JOB_ID of every rank: binds them to this job in the store

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
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(launcherVars, name) {
			env = append(env, kv)
		}
	}
	return append(env, "RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(l.n),
		"LOCAL_RANK="+strconv.Itoa(rank), "LOCAL_WORLD_SIZE="+strconv.Itoa(l.n), "CPCACHE_STORE="+l.store,
		parallel.EnvJobID+"="+l.jobID)
}

// catchSIGPIPE keeps a write to a broken stdout or stderr (the terminal gone after SIGHUP,
// a closed `| head`) from killing this process by SIGPIPE, which Go does by default for fds
// 1 and 2: a launcher killed so takes its ranks with it by SIGKILL (Pdeathsig), without their
// handlers. With the signal caught, such a write fails with EPIPE, which the launcher's
// writes ignore. The ranks do not inherit it: exec restores a caught signal's default.
func catchSIGPIPE() {
	sigpipeOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGPIPE)
		go func() {
			for range ch {
			}
		}()
	})
}

var sigpipeOnce sync.Once

func (l *launcher) run() int {
	catchSIGPIPE()
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
	type exit struct {
		rank int
		err  error
	}
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
			err := cmd.Wait()
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
	for left := started; left > 0; {
		select {
		case e := <-exits:
			left--
			l.mu.Lock()
			l.exited[e.rank] = true
			l.mu.Unlock()
			if st := exitStatus(e.err); st != 0 {
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

// exitStatus maps a Wait error to a shell-style status.
func exitStatus(err error) int {
	if err == nil {
		return 0
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
