package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/sim/report"
)

// rdvJob is a small 2-rank job: a few requests, so that a trial takes about a second.
var rdvJob = []string{"--world", "2", "--dp", "1", "--attn-cp", "2", "--clients", "4", "--rounds", "2",
	"--l1-pages", "160", "--l2-pages", "512", "--kv-bytes-per-token", "64"}

// TestRunSilentRendezvousStore: `cpcache run --store redis://<silent> --timeout 3s` is a bad
// input within its timeout, not a wait without end: the pre-check talks the protocol.
func TestRunSilentRendezvousStore(t *testing.T) {
	start := time.Now()
	status, _, _, stderr := runBinary(t, nil, append([]string{"--store", "redis://" + redistest.Silent(t) + "/p", "--timeout", "3s"}, rdvJob...)...)
	assert.Equal(t, 2, status, "stderr:\n%s", stderr)
	assert.Contains(t, stderr, "did not answer PING")
	assert.NotContains(t, stderr, "[0]", "no rank may start")
	assert.Less(t, time.Since(start), 30*time.Second, "bounded by --timeout 3s")
}

// TestRunRendezvousStoreAuth: a store with requirepass and no password in the URL is a bad
// input (exit 2) before any rank starts, naming the cause; with the password the job runs.
func TestRunRendezvousStoreAuth(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "rdv-s3cret")
	status, _, _, stderr := runBinary(t, nil, append([]string{"--store", "redis://" + srv.Addr() + "/p"}, rdvJob...)...)
	assert.Equal(t, 2, status, "stderr:\n%s", stderr)
	assert.Contains(t, stderr, "requires a password")
	assert.NotContains(t, stderr, "[0]", "no rank may start")
	status, rep, _, stderr := runBinary(t, nil, append([]string{"--store", "redis://:rdv-s3cret@" + srv.Addr() + "/p"}, rdvJob...)...)
	require.Equal(t, 0, status, "stderr:\n%s", stderr)
	require.NotNil(t, rep)
	assert.NotContains(t, stderr, "rdv-s3cret")
}

// TestRunTwoJobsOneRendezvousStore: two `cpcache run` jobs started at once on one file store
// directory, and on one Redis prefix, both work in every trial, each serving its own
// requests (ranks that joined the other job's world would fail, or serve its requests).
func TestRunTwoJobsOneRendezvousStore(t *testing.T) {
	srv := redistest.Start(t)
	stores := map[string]string{"file": "file://" + t.TempDir(), "redis": srv.URL("two-jobs")}
	trials := map[string]int{"file": 10, "redis": 5}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			for trial := 0; trial < trials[name]; trial++ {
				var waits [2]func() (int, *report.Report, string, string)
				for j := range waits {
					waits[j] = startBinary(t, nil, append([]string{"--store", store, "--timeout", "30s"}, rdvJob...)...)
				}
				var requests [2]int64
				for j, w := range waits {
					status, rep, _, stderr := w()
					require.Equal(t, 0, status, "trial %d job %d: stderr:\n%s", trial, j, stderr)
					require.NotNil(t, rep, "trial %d job %d", trial, j)
					requests[j] = rep.Requests
				}
				require.Equal(t, requests[0], requests[1], "trial %d: the same job served different request counts", trial)
			}
		})
	}
	// The file store holds nothing once the jobs are over.
	n := 0
	require.NoError(t, filepath.Walk(strings.TrimPrefix(stores["file"], "file://"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n++
		}
		return err
	}))
	assert.Zero(t, n, fmt.Sprintf("files left in the rendezvous store after %d jobs", 2*trials["file"]))
}

// TestRunStoreInUse: a rank of `cpcache run` whose rendezvous store another job's rank 0
// holds (the same store, no job id on either) is a bad input (exit 2), at once, with one
// line saying the store is in use, and is not a failure of a run (exit 1).
func TestRunStoreInUse(t *testing.T) {
	dir := t.TempDir()
	claim := filepath.Join(dir, "cpcache", "shared", "claim", fmt.Sprintf("%020d", 1))
	require.NoError(t, os.MkdirAll(filepath.Dir(claim), 0o700))
	expiry := time.Now().Add(time.Hour).UnixMilli()
	require.NoError(t, os.WriteFile(claim, []byte(fmt.Sprintf("0123456789abcdef 2 %d ", expiry)), 0o600))
	start := time.Now()
	env := []string{"RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2"}
	status, _, _, stderr := runBinary(t, env, append([]string{"--store", "file://" + dir, "--timeout", "20s"}, rdvJob...)...)
	assert.Equal(t, 2, status, "stderr:\n%s", stderr)
	assert.Contains(t, stderr, "is in use")
	assert.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "one line: %q", stderr)
	assert.Less(t, time.Since(start), 15*time.Second, "at once, not at --timeout 20s")
}
