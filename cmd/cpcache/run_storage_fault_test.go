package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
)

// TestRunRedisStoppedMidRun stops the storage server (SIGSTOP: connections hang instead of
// failing) once the run has backed pages up: the I/O rank's calls time out, the circuit
// opens on every rank, and the run serves every request from L1 and L2, healthy, instead of
// stalling. The wall times of the same run without storage and with the stopped server are
// logged as a ratio (the README and the note quote it; no timing is asserted).
func TestRunRedisStoppedMidRun(t *testing.T) {
	srv := redistest.Start(t) // skips, saying why, without redis-server
	args := storageArgs
	status, base, out, errOut := runBinary(t, nil, args...)
	requireHealthy(t, status, base, out, errOut)

	// A short per-call timeout (the URL's timeout= bounds each storage call) keeps the test
	// quick; the default deadline is 2s.
	wait := startBinary(t, nil, append([]string{"--storage", srv.URL("stopped") + "?timeout=300ms", "--storage-insecure", "--storage-clear"}, args...)...)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := srv.DBSize()
		require.NoError(t, err)
		if n >= 100 || time.Now().After(deadline) {
			break
		}
	}
	srv.Signal(syscall.SIGSTOP)
	defer srv.Signal(syscall.SIGCONT)
	status, rep, out, errOut := wait()
	requireHealthy(t, status, rep, out, errOut)
	assert.Equal(t, base.Requests, rep.Requests)
	assert.Positive(t, rep.StorageCircuitOpenSeconds, "the circuit opened")
	assert.Contains(t, out, "storage circuit      open")
	t.Logf("%d requests on CP4: %.2fs without storage, %.2fs with redis stopped mid-run (%.2f×), circuit open %.2fs, %d storage errors",
		rep.Requests, base.WallSeconds, rep.WallSeconds, rep.WallSeconds/base.WallSeconds, rep.StorageCircuitOpenSeconds, rep.StorageErrors)
}
