package multiproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	roleEnv   = "CPCACHE_MULTIPROC_ROLE"
	reportEnv = "CPCACHE_MULTIPROC_REPORT" // directory of the ranks' reports
)

var (
	rolesMu sync.Mutex // protects roles
	roles   = map[string]func() error{}
)

// Register makes fn runnable as role name. Call it from init or TestMain before Main.
func Register(name string, fn func() error) {
	rolesMu.Lock()
	defer rolesMu.Unlock()
	roles[name] = fn
}

// Main runs a registered role and exits when this process was started by Run; otherwise it
// runs the tests. Use as: func TestMain(m *testing.M) { multiproc.Main(m) }.
func Main(m *testing.M) {
	name := os.Getenv(roleEnv)
	if name == "" {
		os.Exit(m.Run())
	}
	rolesMu.Lock()
	fn := roles[name]
	rolesMu.Unlock()
	if fn == nil {
		fmt.Fprintf(os.Stderr, "multiproc: unknown role %q\n", name)
		os.Exit(3)
	}
	if err := fn(); err != nil {
		fmt.Fprintf(os.Stderr, "rank %s: %v\n", os.Getenv("RANK"), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Result is one rank's outcome.
type Result struct {
	Rank   int
	Err    error // nil when the process exited 0
	Output string
	Report []byte // what the rank passed to Report (nil when it did not)
}

// KilledBy reports whether the rank's process was ended by signal sig.
func (r Result) KilledBy(sig syscall.Signal) bool {
	var exit *exec.ExitError
	if !errors.As(r.Err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// Report hands data to the test as this rank's Result.Report (the last call wins). For role
// functions: it fails outside a rank process started by Start.
func Report(data []byte) error {
	dir := os.Getenv(reportEnv)
	if dir == "" {
		return errors.New("multiproc: Report called outside a rank process")
	}
	return os.WriteFile(reportPath(dir, os.Getenv("RANK")), data, 0o600)
}

func reportPath(dir, rank string) string { return filepath.Join(dir, "rank-"+rank+".report") }

// Spec describes a multi-process run.
type Spec struct {
	Role    string
	N       int
	Env     []string                // extra KEY=VALUE for every rank
	RankEnv func(rank int) []string // extra KEY=VALUE per rank (optional)
	Timeout time.Duration           // whole run; ranks are killed after it (default 2 min)
	// Wrap, when set, returns the command line that starts rank's process given the test
	// binary's argv (for example to run it inside a network namespace).
	Wrap func(rank int, argv []string) []string
}

// Start starts the ranks and returns a function that waits for all of them.
func Start(t testing.TB, s Spec) (wait func() []Result) {
	t.Helper()
	if s.Timeout <= 0 {
		s.Timeout = 2 * time.Minute
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("multiproc: %v", err)
	}
	reports := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), s.Timeout)
	results := make([]Result, s.N)
	var wg sync.WaitGroup
	for r := 0; r < s.N; r++ {
		argv := []string{exe, "-test.run=^$"}
		if s.Wrap != nil {
			argv = s.Wrap(r, argv)
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.Env = append(os.Environ(), roleEnv+"="+s.Role,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(s.N),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(s.N),
			reportEnv+"="+reports)
		cmd.Env = append(cmd.Env, s.Env...)
		if s.RankEnv != nil {
			cmd.Env = append(cmd.Env, s.RankEnv(r)...)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatalf("multiproc: start rank %d: %v", r, err)
		}
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			err := cmd.Wait()
			if ctx.Err() != nil && err != nil {
				err = fmt.Errorf("multiproc: killed after %v: %w", s.Timeout, err)
			}
			report, _ := os.ReadFile(reportPath(reports, strconv.Itoa(r))) // none: nil
			results[r] = Result{Rank: r, Err: err, Output: out.String(), Report: report}
		}(r)
	}
	return func() []Result {
		wg.Wait()
		cancel()
		return results
	}
}

// Run starts the ranks, waits for them, and fails t with every failing rank's output.
func Run(t testing.TB, s Spec) []Result {
	t.Helper()
	res := Start(t, s)()
	for _, r := range res { // in rank order
		if r.Err != nil {
			t.Errorf("rank %d failed: %v\n%s", r.Rank, r.Err, r.Output)
		}
	}
	return res
}

// Rank returns this process's RANK and WORLD_SIZE (for role functions).
func Rank() (rank, size int) {
	rank, _ = strconv.Atoi(os.Getenv("RANK"))
	size, _ = strconv.Atoi(os.Getenv("WORLD_SIZE"))
	return rank, size
}
