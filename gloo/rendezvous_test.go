package gloo_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/parallel"
)

func init() {
	multiproc.Register("tagged-world", roleTaggedWorld)
	multiproc.Register("cycles", roleCycles)
}

// roleTaggedWorld joins the world and checks that every member belongs to this job: each
// rank brings its CPCACHE_TEST_TAG, and a world whose members bring different tags is a
// cross-joined one. A rank refused with ErrStoreInUse exits with status 4.
func roleTaggedWorld() error {
	ctx := context.Background()
	w, err := gloo.NewWorld(ctx, gloo.Options{Timeout: envDur("CPCACHE_TEST_TIMEOUT", 20*time.Second)})
	if errors.Is(err, gloo.ErrStoreInUse) {
		fmt.Fprintf(os.Stderr, "in use: %v\n", err)
		os.Exit(4)
	}
	if err != nil {
		return err
	}
	defer w.Close()
	tag := os.Getenv("CPCACHE_TEST_TAG")
	tags, err := w.AllGather(ctx, []byte(tag))
	if err != nil {
		return err
	}
	for r, got := range tags {
		if string(got) != tag {
			return fmt.Errorf("cross-joined world: rank %d is job %q, this rank job %q", r, got, tag)
		}
	}
	return w.Barrier(ctx)
}

// roleCycles opens and closes the world CPCACHE_TEST_CYCLES times on one store, with an
// all-reduce and a sub-group in each cycle.
func roleCycles() error {
	ctx := context.Background()
	for i := 0; i < envInt("CPCACHE_TEST_CYCLES", 100); i++ {
		w, err := gloo.NewWorld(ctx, gloo.Options{Timeout: 20 * time.Second})
		if err != nil {
			return fmt.Errorf("cycle %d: %w", i, err)
		}
		v := []int64{int64(w.Rank())}
		if err := w.AllReduce(ctx, parallel.Sum, v); err != nil {
			w.Close()
			return fmt.Errorf("cycle %d: %w", i, err)
		}
		if n := int64(w.Size()); v[0] != n*(n-1)/2 {
			w.Close()
			return fmt.Errorf("cycle %d: sum of ranks %d, want %d", i, v[0], n*(n-1)/2)
		}
		g, err := gloo.NewGroup(w, []int{0, w.Size() - 1})
		if err == nil && g != nil {
			err = g.Barrier(ctx)
			g.Close()
		}
		if err == nil {
			err = w.Barrier(ctx)
		}
		w.Close()
		if err != nil {
			return fmt.Errorf("cycle %d: %w", i, err)
		}
	}
	return nil
}

// TestSilentRedisStore: a Redis store that accepts connections and never answers fails
// CheckStore at its context's deadline and NewWorld at its timeout; neither may hang forever.
func TestSilentRedisStore(t *testing.T) {
	url := "redis://" + redistest.Silent(t) + "/silent"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := gloo.CheckStore(ctx, url)
	if !errors.Is(err, parallel.ErrTimeout) || !strings.Contains(err.Error(), "did not answer PING") {
		t.Errorf("CheckStore of a silent server = %v, want a timeout saying it did not answer PING", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("CheckStore took %v with a 1s context", d)
	}
	for _, rank := range []int{0, 1} {
		start = time.Now()
		w, err := gloo.NewWorld(context.Background(), gloo.Options{Store: url, Rank: rank, Size: 2, Timeout: 2 * time.Second})
		if err == nil {
			w.Close()
			t.Fatalf("rank %d: NewWorld on a silent store succeeded", rank)
		}
		if !errors.Is(err, parallel.ErrTimeout) {
			t.Errorf("rank %d: NewWorld on a silent store = %v, want parallel.ErrTimeout", rank, err)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("rank %d: NewWorld with a 2s timeout took %v", rank, d)
		}
	}
}

// TestRedisStoreAuth: a store with requirepass fails CheckStore as a bad argument, naming
// the cause and never the password, when the URL gives none or a wrong one; with the right
// one, CheckStore passes and a 2-rank world rendezvous through it.
func TestRedisStoreAuth(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cr3t-pw")
	host := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct{ url, want string }{
		{"redis://" + host + "/p", "requires a password"},
		{"redis://:wrong-pw@" + host + "/p", "refused the URL's password"},
	} {
		err := gloo.CheckStore(ctx, c.url)
		if !errors.Is(err, parallel.ErrBadArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckStore(%s) = %v, want a bad argument saying %q", c.url, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), "wrong-pw") || strings.Contains(err.Error(), "s3cr3t")) {
			t.Errorf("CheckStore(%s): error %q quotes a password", c.url, err)
		}
	}
	good := "redis://:s3cr3t-pw@" + host + "/auth"
	if err := gloo.CheckStore(ctx, good); err != nil {
		t.Fatalf("CheckStore with the password: %v", err)
	}
	multiproc.Run(t, multiproc.Spec{Role: "tagged-world", N: 2, Timeout: time.Minute,
		Env: []string{"CPCACHE_STORE=" + good, "CPCACHE_TEST_TAG=a"}})
}

// twoJobs starts two 3-rank jobs at once on one store and returns each job's results.
func twoJobs(t *testing.T, store string, jobID func(job int) string) [2][]multiproc.Result {
	var waits [2]func() []multiproc.Result
	for j := 0; j < 2; j++ {
		env := []string{"CPCACHE_STORE=" + store, fmt.Sprintf("CPCACHE_TEST_TAG=job%d", j)}
		if id := jobID(j); id != "" {
			env = append(env, "CPCACHE_JOB_ID="+id)
		}
		waits[j] = multiproc.Start(t, multiproc.Spec{Role: "tagged-world", N: 3, Timeout: time.Minute, Env: env})
	}
	return [2][]multiproc.Result{waits[0](), waits[1]()}
}

// TestTwoJobsOneStore: two jobs started at once on one file store, and on one Redis prefix,
// each with its own job id (what cpcache launch, mpirun, Slurm and torchrun give), both
// work in every trial; every world is its own job's, none joins the other's ranks.
func TestTwoJobsOneStore(t *testing.T) {
	srv := redistest.Start(t)
	stores := map[string]func(t *testing.T) string{
		"file":  func(t *testing.T) string { return "file://" + t.TempDir() },
		"redis": func(t *testing.T) string { return srv.URL("two-jobs") },
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			st := store(t)
			for trial := 0; trial < 10; trial++ {
				res := twoJobs(t, st, func(j int) string { return fmt.Sprintf("trial%d-job%d", trial, j) })
				for j, rs := range res {
					for _, r := range rs {
						if r.Err != nil {
							t.Fatalf("trial %d job %d rank %d: %v\n%s", trial, j, r.Rank, r.Err, r.Output)
						}
					}
				}
			}
		})
	}
}

// TestStoreInUse: without a job id, a job whose rank 0 comes while another job's rank 0
// holds the store (joining) fails at once with ErrStoreInUse, and the first job then
// completes.
func TestStoreInUse(t *testing.T) {
	store := "file://" + t.TempDir()
	// Job A: rank 0 only for now, so its claim stays while job B starts.
	waitA0 := multiproc.Start(t, multiproc.Spec{Role: "tagged-world", N: 1, Timeout: time.Minute,
		Env: []string{"CPCACHE_STORE=" + store, "CPCACHE_TEST_TAG=a", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2"}})
	deadline := time.Now().Add(20 * time.Second)
	for !claimed(t, store) {
		if time.Now().After(deadline) {
			t.Fatal("job A's rank 0 did not claim the store within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	res := multiproc.Start(t, multiproc.Spec{Role: "tagged-world", N: 1, Timeout: time.Minute,
		Env: []string{"CPCACHE_STORE=" + store, "CPCACHE_TEST_TAG=b", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2"}})()
	var ee interface{ ExitCode() int }
	if !errors.As(res[0].Err, &ee) || ee.ExitCode() != 4 || !strings.Contains(res[0].Output, "is in use") {
		t.Errorf("job B's rank 0: %v, want exit 4 (ErrStoreInUse) saying the store is in use; output:\n%s", res[0].Err, res[0].Output)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("job B's rank 0 took %v to fail, want at once (its timeout is 20s)", d)
	}
	waitA1 := multiproc.Start(t, multiproc.Spec{Role: "tagged-world", N: 1, Timeout: time.Minute,
		Env: []string{"CPCACHE_STORE=" + store, "CPCACHE_TEST_TAG=a", "RANK=1", "LOCAL_RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2"}})
	for _, r := range append(waitA0(), waitA1()...) {
		if r.Err != nil {
			t.Errorf("job A: %v\n%s", r.Err, r.Output)
		}
	}
}

// claimed reports whether a file store holds a live claim file.
func claimed(t *testing.T, store string) bool {
	found := false
	_ = filepath.WalkDir(strings.TrimPrefix(store, "file://"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(filepath.Dir(p)) == "claim" {
			found = true
		}
		return nil
	})
	return found
}

// countFiles counts the files (and links) under dir.
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStoreDoesNotGrow: 20 runs on one file store leave no key behind (a run writes about
// 60), and open/close cycles of a 4-rank world on one store never fail: 100
// with one job id (cpcache launch's case: every cycle of its ranks has the same id) and 30
// without one.
func TestStoreDoesNotGrow(t *testing.T) {
	dir := t.TempDir()
	for run := 0; run < 20; run++ {
		multiproc.Run(t, multiproc.Spec{Role: "tagged-world", N: 3, Timeout: time.Minute,
			Env: []string{"CPCACHE_STORE=file://" + dir, "CPCACHE_TEST_TAG=a"}})
		if n := countFiles(t, dir); n != 0 {
			t.Fatalf("after run %d the store holds %d files, want 0", run+1, n)
		}
	}
	for job, cycles := range map[string]string{"cycles-job": "100", "": "30"} {
		multiproc.Run(t, multiproc.Spec{Role: "cycles", N: 4, Timeout: 2 * time.Minute,
			Env: []string{"CPCACHE_STORE=file://" + dir, "CPCACHE_TEST_CYCLES=" + cycles, "CPCACHE_JOB_ID=" + job}})
	}
	if n := countFiles(t, dir); n != 0 {
		t.Fatalf("after the cycles the store holds %d files, want 0", n)
	}
}

// TestStoreReapsDeadRuns: what a killed run left (its keys, a half-written temporary file)
// is removed by the next run once old enough; a recent run's keys stay.
func TestStoreReapsDeadRuns(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-3 * time.Hour)
	mk := func(rel string, mtime time.Time) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := []string{
		mk("cpcache/job-0123456789abcdef/deadrun/world/0", old),
		mk("cpcache/shared/deadrun2/ack/1", old),
		mk("cpcache/shared/oldrun/.tmp-0011223344556677", old),
	}
	live := mk("cpcache/job-fedcba9876543210/liverun/world/0", time.Now())
	multiproc.Run(t, multiproc.Spec{Role: "tagged-world", N: 2, Timeout: time.Minute,
		Env: []string{"CPCACHE_STORE=file://" + dir, "CPCACHE_TEST_TAG=a"}})
	for _, p := range dead {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left by a dead run is still there (%v)", p, err)
		}
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a recent run's key was removed: %v", err)
	}
}

// TestStoreNoEscape: a symbolic link in a file store pointing outside it is not followed
// (a store writer could otherwise make the rendezvous write elsewhere).
func TestStoreNoEscape(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "cpcache")); err != nil {
		t.Fatal(err)
	}
	w, err := gloo.NewWorld(context.Background(), gloo.Options{Store: "file://" + dir, Rank: 0, Size: 1, Timeout: 5 * time.Second})
	if err == nil {
		w.Close()
		t.Error("NewWorld through a store whose key directory links outside it succeeded")
	}
	if n := countFiles(t, outside); n != 0 {
		t.Errorf("the rendezvous wrote %d files outside the store", n)
	}
}

// TestStoreFIFOKey: a named pipe planted in a file store where a key is read (here the
// claim rank 0 reads first) fails the rendezvous at once, naming it; reading it would wait
// for a writer forever, past any deadline (a file read is not cancelled by a context).
func TestStoreFIFOKey(t *testing.T) {
	dir := t.TempDir()
	claim := filepath.Join(dir, "cpcache", "shared", "claim", fmt.Sprintf("%020d", 1))
	if err := os.MkdirAll(filepath.Dir(claim), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(claim, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		w, err := gloo.NewWorld(context.Background(), gloo.Options{Store: "file://" + dir, Rank: 0, Size: 1, Timeout: 3 * time.Second})
		if err == nil {
			w.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file (a named pipe)") {
			t.Errorf("NewWorld = %v, want an error naming the named pipe", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("NewWorld (timeout 3s) still waits after 20s on a named pipe in the store")
	}
}
