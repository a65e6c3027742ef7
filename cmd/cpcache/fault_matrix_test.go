package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/sim/report"
)

// EnvFaultSoak runs the fault matrix on every layout × consensus backend (4 runs per case)
// instead of two per case.
const EnvFaultSoak = "CPCACHE_FAULT_SOAK"

// faultDeadline is the runs' --timeout: every collective (and the rendezvous) gives up on a
// missing peer after it. Long enough that 8 ranks starting on a loaded 2-core machine meet.
const faultDeadline = 6 * time.Second

// faultCase is one row of the matrix: a --fault spec (or extra flags), and what every rank
// must end with.
type faultCase struct {
	name  string
	args  []string
	check func(t *testing.T, m *matrixRun) // judges the outcome
	// storage: the run gets a file:// storage.
	storage bool
}

// matrixLayout is one layout of the matrix.
type matrixLayout struct {
	name string
	args []string
	dp   int // replicas of 8/dp ranks each: ranks r*8/dp .. (r+1)*8/dp-1
}

var (
	layoutCP8    = matrixLayout{"CP8", []string{"--dp", "1", "--attn-cp", "8"}, 1}
	layoutCP4DP2 = matrixLayout{"CP4·DP2", []string{"--dp", "2", "--attn-cp", "4"}, 2}
)

// rankEnd is how one rank process ended.
type rankEnd struct {
	status int
	killed bool          // by SIGKILL
	at     time.Duration // since the run started
	where  string        // "ok", "step N", "slabs", "rendezvous", "start", "report", or "?"
	kind   string        // "ok", "peer-lost", "timeout", "start-error", "diverged", or the error text
	output string
}

// matrixRun is one run of 8 rank processes of `cpcache run`.
type matrixRun struct {
	layout matrixLayout
	ends   []rankEnd
	report *report.Report // rank 0's, when it wrote one
	wall   time.Duration
}

var (
	stepRE = regexp.MustCompile(`(?:consensus step|diverged at step) (\d+)`)
	lineRE = regexp.MustCompile(`(?m)^cpcache: run: .*$`)
)

// classify reads how a rank ended from its exit status and its error line.
func classify(status int, killed bool, out string) (where, kind string) {
	if status == 0 {
		return "ok", "ok"
	}
	if killed {
		return "killed", "killed"
	}
	line := lineRE.FindString(out)
	switch m := stepRE.FindStringSubmatch(line); {
	case m != nil:
		where = "step " + m[1]
	case strings.Contains(line, "could not start"):
		where = "start"
	case strings.Contains(line, "--storage-clear"):
		where = "clear"
	case strings.Contains(line, "slab: open set"):
		where = "slabs"
	case strings.Contains(line, "gathering the report"):
		where = "report"
	case strings.Contains(line, "gloo: "):
		where = "rendezvous"
	default:
		where = "?"
	}
	switch {
	case strings.Contains(line, "could not start"):
		kind = "start-error"
	case strings.Contains(line, "--storage-clear"):
		kind = "clear-error"
	case strings.Contains(line, "diverged"):
		kind = "diverged"
	case strings.Contains(line, "peer lost"):
		kind = "peer-lost"
	case strings.Contains(line, "timeout"), strings.Contains(line, "timed out"), strings.Contains(line, "deadline"):
		kind = "timeout"
	default:
		kind = "error: " + line
	}
	return where, kind
}

// runRanks starts the 8 ranks of one run as separate processes (no launcher: a failing rank
// does not stop the others, so each survivor shows how it ends by itself) and waits for
// them, killing what is left after a generous bound.
func runRanks(t *testing.T, l matrixLayout, args []string) *matrixRun {
	t.Helper()
	const n = 8
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "report.json")
	argv := append(append([]string{"run", "--world", "8", "--timeout", faultDeadline.String(), "--json", jsonPath}, l.args...), smallSynthetic...)
	argv = append(argv, l1For(8/l.dp)...) // every matrix layout has CP 8/dp
	argv = append(argv, args...)
	base := append([]string{"CPCACHE_STORE=file://" + filepath.Join(dir, "store")}, withoutLauncherEnv(nil)...)
	bin := cpcacheBinary(t)
	m := &matrixRun{layout: l, ends: make([]rankEnd, n)}
	start := time.Now()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*strings.Builder, n)
	done := make(chan int, n)
	for r := range n {
		cmd := exec.Command(bin, argv...)
		cmd.Env = append(slices.Clone(base), "RANK="+strconv.Itoa(r), "WORLD_SIZE=8", "LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE=8")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		outs[r] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d: %v", r, err)
		}
		cmds[r] = cmd
		go func() {
			err := cmd.Wait()
			e := rankEnd{at: time.Since(start), output: outs[r].String()}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				e.status = ee.ExitCode()
				ws, ok := ee.Sys().(syscall.WaitStatus)
				e.killed = ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
			} else if err != nil {
				e.status, e.output = -1, err.Error()
			}
			e.where, e.kind = classify(e.status, e.killed, e.output)
			m.ends[r] = e
			done <- r
		}()
	}
	bound := time.After(3*faultDeadline + 60*time.Second)
	for range n {
		select {
		case <-done:
		case <-bound:
			for _, c := range cmds {
				_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			}
			t.Fatalf("ranks still running after %v: a rank hangs", time.Since(start))
		}
	}
	m.wall = time.Since(start)
	// Nothing of the run may be left: no process of its process groups, no shm segment.
	for r, c := range cmds {
		if err := syscall.Kill(-c.Process.Pid, 0); err == nil {
			t.Errorf("rank %d left a process behind", r)
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	}
	if leaked := leakedSegments(start); len(leaked) > 0 {
		t.Errorf("shared-memory segments left behind: %v", leaked)
	}
	if b, err := os.ReadFile(jsonPath); err == nil && len(b) > 0 { // a failed run leaves it empty
		m.report = &report.Report{}
		if err := json.Unmarshal(b, m.report); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// runSegmentRE matches the names of the segments a run makes: its L2 slabs (tag
// cpcache-run) and its shared-memory consensus groups.
var runSegmentRE = regexp.MustCompile(`^(cpcache-slab-cpcache-run|cpcache-shm-[0-9a-f]+$)`)

// leakedSegments lists the segments in /dev/shm that a run makes, made since start, that no
// live process maps (other jobs on the machine may be creating theirs meanwhile: those are
// mapped).
func leakedSegments(since time.Time) []string {
	names, _ := filepath.Glob("/dev/shm/cpcache-*")
	var out []string
	for _, n := range names {
		if fi, err := os.Stat(n); err != nil || fi.ModTime().Before(since) || !runSegmentRE.MatchString(filepath.Base(n)) {
			continue
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil
	}
	maps, _ := filepath.Glob("/proc/[0-9]*/maps")
	for _, mp := range maps {
		b, err := os.ReadFile(mp)
		if err != nil {
			continue
		}
		out = slices.DeleteFunc(out, func(n string) bool { return strings.Contains(string(b), n) })
	}
	return out
}

// replicaOf is the replica (consensus group) of rank r.
func (m *matrixRun) replicaOf(r int) int { return r / (8 / m.layout.dp) }

// outcome summarizes the run for the table: each replica's common end.
func (m *matrixRun) outcome() string {
	var parts []string
	for dp := range m.layout.dp {
		seen := map[string][]int{}
		var order []string
		for r, e := range m.ends {
			if m.replicaOf(r) != dp {
				continue
			}
			k := e.kind + "@" + e.where
			if seen[k] == nil {
				order = append(order, k)
			}
			seen[k] = append(seen[k], r)
		}
		var s []string
		for _, k := range order {
			s = append(s, fmt.Sprintf("%s %v", k, seen[k]))
		}
		parts = append(parts, fmt.Sprintf("replica %d: %s", dp, strings.Join(s, ", ")))
	}
	return strings.Join(parts, "; ")
}

func (m *matrixRun) dump(t *testing.T) {
	t.Helper()
	for r, e := range m.ends {
		t.Logf("rank %d: status %d at %v (%s@%s)\n%s", r, e.status, e.at.Round(time.Millisecond), e.kind, e.where, e.output)
	}
}

// requireAllOK: every rank exits 0; the report shows no bad page, exactly wantDiv
// divergences, each recovered, and one collective per step.
func requireAllOK(wantDiv int64) func(t *testing.T, m *matrixRun) {
	return func(t *testing.T, m *matrixRun) {
		t.Helper()
		for r, e := range m.ends {
			if e.status != 0 {
				m.dump(t)
				t.Fatalf("rank %d exited %d", r, e.status)
			}
		}
		rep := m.report
		if rep == nil || rep.BadPages != 0 || rep.Divergences != wantDiv || rep.Recoveries != rep.Divergences || rep.CollectivesPerStep != 1 {
			m.dump(t)
			t.Fatalf("report %+v: want 0 bad pages, %d divergences all recovered, 1 collective per step", rep, wantDiv)
		}
	}
}

// requireCircuitOpened: every rank exits 0 and the storage circuit opened.
func requireCircuitOpened(t *testing.T, m *matrixRun) {
	t.Helper()
	requireAllOK(0)(t, m)
	if m.report.StorageErrors == 0 || m.report.StorageCircuitOpenSeconds == 0 {
		t.Fatalf("%d storage errors, circuit open %.2fs: the storage fault did not open the circuit", m.report.StorageErrors, m.report.StorageCircuitOpenSeconds)
	}
}

// How the victim of a fault must end (requireSurvivorsAgree).
const (
	victimKilled = "killed" // by SIGKILL
	victimSame   = "same"   // like every rank of its replica
	victimFailed = "failed" // with an error of its own (a rank stopped past the deadline)
)

// requireSurvivorsAgree: the victim (-1: none) ends as victimEnd says; in each replica every
// other rank ends with the same error kind at the same place (the victim's replica: wantKind
// at wantWhere), exits 1, and does so within the deadline plus 5 s of the first end.
func requireSurvivorsAgree(victim int, victimEnd, wantKind, wantWhere string) func(t *testing.T, m *matrixRun) {
	return func(t *testing.T, m *matrixRun) {
		t.Helper()
		first := slices.MinFunc(m.ends, func(a, b rankEnd) int { return int(a.at - b.at) }).at
		byReplica := map[int]rankEnd{}
		for r, e := range m.ends {
			if r == victim && victimEnd != victimSame {
				if victimEnd == victimKilled && !e.killed || e.status == 0 {
					m.dump(t)
					t.Fatalf("victim rank %d ended %s@%s, status %d; want %s", r, e.kind, e.where, e.status, victimEnd)
				}
				continue
			}
			dp := m.replicaOf(r)
			ref, ok := byReplica[dp]
			if !ok {
				byReplica[dp], ref = e, e
			}
			if e.status != 1 || e.kind != ref.kind || e.where != ref.where {
				m.dump(t)
				t.Fatalf("rank %d (replica %d) ended %s@%s status %d; rank of the same replica ended %s@%s", r, dp, e.kind, e.where, e.status, ref.kind, ref.where)
			}
			if e.at-first > faultDeadline+5*time.Second {
				m.dump(t)
				t.Fatalf("rank %d ended %v after the first rank: more than the deadline %v + 5s", r, e.at-first, faultDeadline)
			}
		}
		vr := m.replicaOf(max(victim, 0))
		if got := byReplica[vr]; got.kind != wantKind || got.where != wantWhere {
			m.dump(t)
			t.Fatalf("replica %d (the victim's) ended %s@%s, want %s@%s", vr, got.kind, got.where, wantKind, wantWhere)
		}
	}
}

// TestFaultMatrix runs every fault on 8 rank processes, on CP8 and CP4·DP2 with the shared
// memory and the Gloo consensus (alternating; all four with CPCACHE_FAULT_SOAK=1), and
// checks that every rank ends as the failure model says, then prints the table.
func TestFaultMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault matrix runs 8-process jobs; skipped with -short")
	}
	cases := []faultCase{
		{name: "copy-fail", args: []string{"--fault", "copy-fail:rank=3,step=100"}, check: func(t *testing.T, m *matrixRun) {
			requireAllOK(0)(t, m)
			if m.report.CopyFailures != 1 {
				t.Fatalf("%d copy failures agreed, want 1", m.report.CopyFailures)
			}
		}},
		{name: "diverge-tree", args: []string{"--fault", "diverge-tree:rank=2,step=150"}, check: requireAllOK(1)},
		{name: "diverge-placement", args: []string{"--fault", "diverge-placement:rank=1,step=200"}, check: requireAllOK(1)},
		{name: "diverge-tree --strict", args: []string{"--strict", "--fault", "diverge-tree:rank=2,step=150"},
			check: requireSurvivorsAgree(-1, victimSame, "diverged", "step 150")},
		{name: "new-fail", args: []string{"--fault", "new-fail:rank=1"}, check: requireSurvivorsAgree(1, victimSame, "start-error", "start")},
		{name: "storage-hang", args: []string{"--fault", "storage-hang:after=0s,for=3s", "--storage-timeout", "200ms"}, storage: true, check: requireCircuitOpened},
		{name: "storage-error", args: []string{"--fault", "storage-error:after=0s"}, storage: true, check: requireCircuitOpened},
		{name: "storage clear fails", args: []string{"--storage-clear", "--fault", "storage-error:op=clear,rank=0"}, storage: true,
			check: requireSurvivorsAgree(-1, victimSame, "clear-error", "clear")},
		{name: "flush while busy", args: []string{"--fault", "flush:step=50"}, check: func(t *testing.T, m *matrixRun) {
			requireAllOK(0)(t, m)
			if m.report.FlushesRefused != int64(m.layout.dp) {
				t.Fatalf("%d flushes refused, want one per replica", m.report.FlushesRefused)
			}
		}},
		// In quarantine the replicas may differ in idleness, so Flush agrees it with a
		// collective of its own (refused or done alike on every rank); the runner's check of one
		// consensus collective per step must not count it.
		{name: "flush in quarantine", args: []string{"--fault", "diverge-tree:rank=2,step=150;flush:step=151"}, check: func(t *testing.T, m *matrixRun) {
			requireAllOK(1)(t, m)
			if n := m.report.Flushes + m.report.FlushesRefused; n != int64(m.layout.dp) {
				t.Fatalf("%d flushes done or refused, want one per replica", n)
			}
		}},
		{name: "kill -9 at start-up", args: []string{"--fault", "kill:rank=5,at=start"}, check: requireSurvivorsAgree(5, victimKilled, "timeout", "rendezvous")},
		{name: "kill -9 in slab exchange", args: []string{"--fault", "kill:rank=6,at=slabs"}, check: requireSurvivorsAgree(6, victimKilled, "peer-lost", "slabs")},
		{name: "kill -9 mid-run", args: []string{"--fault", "kill:rank=2,at=step,step=120"}, check: requireSurvivorsAgree(2, victimKilled, "peer-lost", "step 120")},
		{name: "SIGSTOP stall 1s", args: []string{"--fault", "stall:rank=4,step=80,for=1s"}, check: requireAllOK(0)},
		{name: "SIGSTOP stall past deadline", args: []string{"--fault", "stall:rank=4,step=80,for=" + (faultDeadline + 2*time.Second).String()},
			check: requireSurvivorsAgree(4, victimFailed, "timeout", "step 80")},
	}
	type combo struct {
		layout    matrixLayout
		consensus string
	}
	all := []combo{{layoutCP8, "shm"}, {layoutCP4DP2, "gloo"}, {layoutCP8, "gloo"}, {layoutCP4DP2, "shm"}}
	var table []string
	for i, c := range cases {
		combos := []combo{all[2*(i%2)], all[2*(i%2)+1]}
		if os.Getenv(EnvFaultSoak) != "" {
			combos = all
		}
		for _, cb := range combos {
			name := fmt.Sprintf("%s/%s/%s", c.name, cb.layout.name, cb.consensus)
			t.Run(name, func(t *testing.T) {
				args := append([]string{"--consensus", cb.consensus}, c.args...)
				if c.storage {
					args = append(args, "--storage", "file://"+t.TempDir())
				}
				m := runRanks(t, cb.layout, args)
				c.check(t, m)
				table = append(table, fmt.Sprintf("| %-27s | %-7s | %-4s | %-90s | %6.1fs |", c.name, cb.layout.name, cb.consensus, m.outcome(), m.wall.Seconds()))
			})
		}
	}
	t.Logf("fault matrix (deadline %v):\n| %-27s | %-7s | %-4s | %-90s | %7s |\n%s", faultDeadline, "case", "layout", "cons", "outcome (kind@where [ranks])", "time",
		strings.Join(table, "\n"))
}
