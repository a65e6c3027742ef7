package runner

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/workload"
)

// storeBytes is what a file store's capacity counts under root: its page files (and writes
// in progress), not the root's own files; and the largest file, a stored page.
func storeBytes(t *testing.T, root string) (total, page int64) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Dir(path) == root {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			total += fi.Size()
			page = max(page, fi.Size())
		}
		return err
	}))
	return total, page
}

// TestRunStoreWithinCapacity: CP4 runs backing up to a file:// store whose capacity is half
// of what the workload stores leave it within the capacity (plus at most one backup batch
// per rank in flight, at most a rank's L2), run after run, with every page served checked;
// the ranks' stores count the evictions.
func TestRunStoreWithinCapacity(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Layout = parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}
	cfg.Synthetic = workload.SyntheticConfig{Clients: 24, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 8, Seed: 5}
	cfg.PageSize, cfg.L1Pages, cfg.L2Pages, cfg.KVBytesPerToken = 8, 24, 64, 8

	unlimited := t.TempDir()
	cfg.Storage = "file://" + unlimited
	p, err := Prepare(cfg)
	require.NoError(t, err)
	requireAgreed(t, p, runInProcess(t, p, -1))
	full, page := storeBytes(t, unlimited)
	require.Positive(t, page)

	dir := t.TempDir()
	capacity := full / 2
	cfg.Storage = fmt.Sprintf("file://%s?max_bytes=%d", dir, capacity)
	p, err = Prepare(cfg)
	require.NoError(t, err)
	overshoot := int64(cfg.Layout.World*cfg.L2Pages) * page
	var mu sync.Mutex
	var handles []storage.Storage
	for run := range 2 {
		out := runInProcessWith(t, p, inProcessOptions{corruptRank: -1, wrapStorage: func(_ int, st storage.Storage) storage.Storage {
			mu.Lock()
			handles = append(handles, st)
			mu.Unlock()
			return st
		}})
		requireAgreed(t, p, out)
		// A page evicted between the group's presence check and its read is a short read
		// (the rest of the prefetch computed) and a storage error; a backup past the
		// capacity whose eviction did not finish in time fails: counted, not asserted.
		var errs int64
		for _, o := range out {
			errs += o.stats.StorageErrors
		}
		got, _ := storeBytes(t, dir)
		var evicted uint64
		for _, h := range handles {
			evicted += h.Stats().Evicted
		}
		t.Logf("run %d: the workload stores %d bytes; the store holds %d of a capacity of %d (%.3f); %d pages evicted so far; hit L3 %d tokens; %d storage errors",
			run, full, got, capacity, float64(got)/float64(capacity), evicted, out[0].counts.HitL3, errs)
		assert.LessOrEqual(t, got, capacity+overshoot, "run %d: the store stays within its capacity plus one batch per rank", run)
		assert.Positive(t, evicted, "run %d: evictions counted", run)
	}
}
