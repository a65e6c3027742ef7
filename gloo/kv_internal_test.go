package gloo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
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
