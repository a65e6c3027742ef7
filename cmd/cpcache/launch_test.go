package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the launcher's writers and the test's reads.
type syncBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLaunchEnvAndPrefixes(t *testing.T) {
	var out, errOut syncBuffer
	t.Setenv("OMPI_COMM_WORLD_RANK", "7") // another launcher's variables must not leak
	st := runLaunch([]string{"-n", "3", "--", "sh", "-c",
		`echo "env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE ${OMPI_COMM_WORLD_RANK:-none}"; ` +
			`echo "store $CPCACHE_STORE"; echo oops >&2; printf tail`}, &out, &errOut)
	if st != 0 {
		t.Fatalf("status %d, stderr:\n%s", st, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 9 {
		t.Fatalf("got %d stdout lines, want 9:\n%s", len(lines), out.String())
	}
	var store string
	for r := 0; r < 3; r++ {
		p := "[" + string(rune('0'+r)) + "] "
		if !strings.Contains(out.String(), p+"env "+string(rune('0'+r))+" 3 "+string(rune('0'+r))+" 3 none\n") {
			t.Errorf("rank %d: no correct env line in:\n%s", r, out.String())
		}
		if !strings.Contains(out.String(), p+"tail\n") {
			t.Errorf("rank %d: unterminated last line not prefixed in:\n%s", r, out.String())
		}
		if !strings.Contains(errOut.String(), p+"oops\n") {
			t.Errorf("rank %d: stderr line not prefixed in:\n%s", r, errOut.String())
		}
		for _, l := range lines {
			if s, ok := strings.CutPrefix(l, p+"store "); ok {
				if store != "" && s != store {
					t.Errorf("ranks got different stores %q and %q", store, s)
				}
				store = s
			}
		}
	}
	dir, ok := strings.CutPrefix(store, "file://")
	if !ok || dir == "" {
		t.Fatalf("default store %q is not a file:// URL", store)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temporary store directory %s still exists after launch (stat: %v)", dir, err)
	}
}

func TestLaunchStoreFlag(t *testing.T) {
	var out, errOut syncBuffer
	store := "file://" + t.TempDir()
	if st := runLaunch([]string{"-n", "1", "--store", store, "--", "sh", "-c", "echo $CPCACHE_STORE"}, &out, &errOut); st != 0 {
		t.Fatalf("status %d: %s", st, errOut.String())
	}
	if got := out.String(); got != "[0] "+store+"\n" {
		t.Errorf("output %q, want the --store URL", got)
	}
}

func TestLaunchFirstFailureStopsOthers(t *testing.T) {
	var out, errOut syncBuffer
	// Rank 1 fails once the others have set their SIGTERM trap (each says so with a file in
	// ready); they would loop forever unless launch stops them.
	ready := t.TempDir()
	script := `trap 'echo stopped; exit 0' TERM
if [ "$RANK" = 1 ]; then
  while [ "$(ls "$READY" | wc -l)" -lt 3 ]; do sleep 0.01; done
  exit 3
fi
touch "$READY/rank-$RANK"
while :; do sleep 0.1; done`
	t.Setenv("READY", ready)
	st := runLaunch([]string{"-n", "4", "--", "sh", "-c", script}, &out, &errOut)
	if st != 3 {
		t.Fatalf("status %d, want rank 1's 3; stderr:\n%s", st, errOut.String())
	}
	if !strings.Contains(errOut.String(), "rank 1 failed with status 3") {
		t.Errorf("stderr does not name the failing rank:\n%s", errOut.String())
	}
	if n := strings.Count(out.String(), "stopped"); n != 3 {
		t.Errorf("%d ranks reported SIGTERM, want 3:\n%s", n, out.String())
	}
}

func TestLaunchForwardsSignals(t *testing.T) {
	var out, errOut syncBuffer
	done := make(chan int)
	go func() {
		done <- runLaunch([]string{"-n", "2", "--", "sh", "-c",
			`trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.1; done`}, &out, &errOut)
	}()
	deadline := time.Now().Add(time.Minute)
	for strings.Count(out.String(), "ready") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("ranks never became ready:\n%s\n%s", out.String(), errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st != 130 {
		t.Errorf("status %d, want 130 (128+SIGINT, whatever the ranks' status)\nstdout:\n%s\nstderr:\n%s", st, out.String(), errOut.String())
	}
	if n := strings.Count(out.String(), "got-int"); n != 2 {
		t.Errorf("%d ranks got SIGINT, want 2:\n%s", n, out.String())
	}
}

func TestLaunchUsage(t *testing.T) {
	for _, args := range [][]string{{"--", "true"}, {"-n", "0", "--", "true"}, {"-n", "2"}, {"-bogus"}} {
		var out, errOut syncBuffer
		if st := runLaunch(args, &out, &errOut); st != 2 {
			t.Errorf("launch %q: status %d, want 2", args, st)
		}
	}
	var out, errOut syncBuffer
	if st := runLaunch([]string{"-n", "2", "--", "/nonexistent/cmd"}, &out, &errOut); st != 127 {
		t.Errorf("missing command: status %d, want 127; stderr %s", st, errOut.String())
	}
}

func TestLaunchLeftoverChild(t *testing.T) {
	var out, errOut syncBuffer
	// The rank exits at once but leaves a child holding its output open: launch must not
	// wait for the child, and must not leave it running.
	dir := t.TempDir()
	st := runLaunch([]string{"-n", "1", "--", "sh", "-c", "sleep 600 & echo $! > " + dir + "/pid; echo done"}, &out, &errOut)
	if st != 0 || out.String() != "[0] done\n" {
		t.Fatalf("status %d output %q, want 0 and \"[0] done\"", st, out.String())
	}
	b, err := os.ReadFile(dir + "/pid")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(st), ") Z ") {
			break // a zombie waiting for init: dead
		}
		if time.Now().After(deadline) {
			t.Fatalf("leftover child %d still running", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLaunchLeavesStuckRankBehind: a rank that wrote its exit status (as a cpcache rank
// does just before it exits) but whose reap never returns (a process a thread stuck in the
// kernel holds: SIGKILL waits for the kernel too) is left behind after the grace with a
// warning, and launch returns with the job's status: the first failing rank's, counting
// the stuck rank's own.
func TestLaunchLeavesStuckRankBehind(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stuckStatus int
		want        int
	}{{"ok", 0, 0}, {"failed", 3, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut syncBuffer
			exitDir := t.TempDir()
			release := make(chan struct{})
			defer close(release)
			l := &launcher{n: 3, store: "file://" + t.TempDir(), exitDir: exitDir, exitGrace: 500 * time.Millisecond,
				argv: []string{"sh", "-c", `st=0; [ "$RANK" = 1 ] && st=` + strconv.Itoa(tc.stuckStatus) + `
echo "$st" > "$CPCACHE_LAUNCH_EXIT_DIR/exit-$RANK"; echo done; exit "$st"`},
				stdout: &lineWriter{w: &out}, stderr: &lineWriter{w: &errOut}}
			l.wait = func(c *exec.Cmd) error {
				err := c.Wait()
				if slices.Contains(c.Env, "RANK=1") {
					<-release // the kernel never lets it go
				}
				return err
			}
			status := make(chan int, 1)
			start := time.Now()
			go func() { status <- l.run() }()
			select {
			case st := <-status:
				if st != tc.want {
					t.Fatalf("status %d, want %d; stderr:\n%s", st, tc.want, errOut.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("launch still waiting for a rank it cannot reap after 30 s; stderr:\n%s", errOut.String())
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("launch returned after %v (grace 500ms)", d)
			}
			want := fmt.Sprintf("launch: warning: rank 1 exited with status %d but did not end within 500ms: a thread of it is stuck in the kernel (a frozen or hung file system?); leaving it behind", tc.stuckStatus)
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("stderr has no %q:\n%s", want, errOut.String())
			}
			if n := strings.Count(errOut.String(), "warning: rank"); n != 1 {
				t.Errorf("%d ranks left behind, want 1:\n%s", n, errOut.String())
			}
		})
	}
}

// TestLaunchExitFileWithoutStuckRank: ranks that write their exit file and exit are reaped
// as usual (no warning), and the exit directory is a job's own: the ranks get it, not one
// inherited from a parent launcher.
func TestLaunchExitFileWithoutStuckRank(t *testing.T) {
	var out, errOut syncBuffer
	t.Setenv(envExitDir, "/nonexistent-parent-exit-dir")
	st := runLaunch([]string{"-n", "2", "--", "sh", "-c", `echo 0 > "$CPCACHE_LAUNCH_EXIT_DIR/exit-$RANK" && echo wrote`}, &out, &errOut)
	if st != 0 || strings.Count(out.String(), "wrote") != 2 || strings.Contains(errOut.String(), "warning") {
		t.Fatalf("status %d; stdout:\n%s\nstderr:\n%s", st, out.String(), errOut.String())
	}
}
