package gloo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// TestFileReapSparesJoiningJob: the reap of dead runs leaves a job space whose claim is live
// whole, however old its keys: a job with a timeout longer than the reaper's (here 3 h) may
// still read keys written more than an hour ago, and its claim is what keeps a second job
// out of its space. The keys of a space with an expired claim go, and so do old keys in the
// reaper's own space.
func TestFileReapSparesJoiningJob(t *testing.T) {
	dir := t.TempDir()
	f, err := openFileKV(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Hour)
	write := func(key string, val []byte) string {
		t.Helper()
		if err := f.put(ctx, key, val); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, keyPath(key))
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		return p
	}
	claimVal := func(expiry time.Time) []byte {
		return []byte(fmt.Sprintf("run1 4 %d job", expiry.UnixMilli()))
	}
	liveKeys := []string{
		write("cpcache/job-live/claim/"+claimGen(1), claimVal(time.Now().Add(time.Hour))),
		write("cpcache/job-live/run1/world/0", []byte("addr")),
		write("cpcache/job-live/run1/ack/1", []byte("nonce 4")),
	}
	deadKeys := []string{
		write("cpcache/job-dead/claim/"+claimGen(1), claimVal(time.Now().Add(-time.Hour))),
		write("cpcache/job-dead/run0/world/0", []byte("addr")),
		// The reaper's own space: it holds the live claim itself, and an old run there is dead.
		write("cpcache/job-mine/run0/world/0", []byte("addr")),
	}
	write("cpcache/job-mine/claim/"+claimGen(1), claimVal(time.Now().Add(time.Hour)))
	if err := f.reap(ctx, "cpcache", "cpcache/job-mine", time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, p := range liveKeys {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the reap removed %s of a job whose claim is live: %v", p, err)
		}
	}
	for _, p := range deadKeys {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s of a dead run is still there (%v)", p, err)
		}
	}
}

// TestWorldSizeMismatchIsMismatch: ranks of one job started with two world sizes fail with
// parallel.ErrMismatch (CPCACHE_ERR_CONFIG for the C ABI: the launch is misconfigured), on
// rank 0 and on the rank that differs, at once, not with an untyped error (an I/O failure)
// or, on rank 0, a timeout (the other rank's close removed the ack that tells it); the store
// is left empty.
func TestWorldSizeMismatchIsMismatch(t *testing.T) {
	spec, err := parseStore("file://" + t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	errs := make(chan error, 2)
	for rank, size := range []int{2, 3} {
		go func() {
			b, err := spec.openKV(context.Background(), time.Minute)
			if err != nil {
				errs <- err
				return
			}
			st, err := newStore(context.Background(), spec, b)
			if err != nil {
				errs <- err
				return
			}
			_, release, err := agreeRun(st, jobSpace(spec.prefix, "job"), "job", rank, size, deadline, time.Minute)
			if release != nil {
				release()
			}
			st.close()
			errs <- fmt.Errorf("rank %d: %w", rank, err)
		}()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, parallel.ErrMismatch) || !strings.Contains(err.Error(), "world size mismatch") {
			t.Errorf("%v, want parallel.ErrMismatch naming the world size mismatch", err)
		}
	}
	_ = filepath.WalkDir(spec.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("%s is left in the store", p)
		}
		return nil
	})
}
