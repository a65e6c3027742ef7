package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
)

// TestRunRedisStoppedMidRun stops the storage server (SIGSTOP: connections hang instead of
// failing) once the run has backed pages up: the ranks' calls time out, the circuit
// opens on every rank, and the run serves every request from L1 and L2, healthy, instead of
// stalling. The wall times of the same run without storage and with the stopped server are
// logged as a ratio (docs/operating.md and the note quote it; no timing is asserted).
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

// TestRunStorageFrozen freezes the file system of a file:// store from the start of the run
// (--fault storage-freeze: every file operation blocks in the "kernel", deaf to deadlines,
// as on a frozen ext4 or a hung NFS mount): the calls are abandoned at --storage-timeout,
// the circuit opens on every rank, the job serves every request from L1 and L2 and ends,
// healthy, with the report counting the abandoned operations and the time the circuit was
// open. Without the freeze bounded, the job waits for the file system forever.
func TestRunStorageFrozen(t *testing.T) {
	args := append([]string{"--storage", "file://" + t.TempDir(), "--storage-timeout", "200ms", "--fault", "storage-freeze:op=put"}, storageArgs...)
	defer panicAfter(2*time.Minute, "cpcache run on a frozen file store still running")()
	status, rep, out, errOut := runBinary(t, nil, args...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Positive(t, rep.StorageAbandoned, "operations abandoned")
	assert.Positive(t, rep.StorageCircuitOpenSeconds, "the circuit opened")
	assert.Zero(t, rep.PagesBackedUp, "nothing backed up to a frozen file system")
	assert.Regexp(t, `storage circuit      open \d+\.\d s, [1-9]\d* operations abandoned in the kernel`, out)
	t.Logf("%d requests in %.2fs, circuit open %.2fs, %d operations abandoned, %d storage errors",
		rep.Requests, rep.WallSeconds, rep.StorageCircuitOpenSeconds, rep.StorageAbandoned, rep.StorageErrors)
}

// TestRunStorageFreezeNeedsFileStore: --fault storage-freeze is a bad input (status 2)
// without a file:// store.
func TestRunStorageFreezeNeedsFileStore(t *testing.T) {
	status, _, _, errOut := runBinary(t, nil, append([]string{"--fault", "storage-freeze"}, storageArgs...)...)
	assert.Equal(t, 2, status, errOut)
	assert.Contains(t, errOut, "storage-freeze freezes a file system: it needs --storage file:///DIR")
}

// TestRunRankStuckAtExit: a rank that ended its part (report gathered, exit status written)
// but whose process never ends (as one a thread stuck in a frozen file system holds: here
// it ignores the signals launch sends before SIGKILL and never exits by itself) is left
// behind after a grace of seconds: the report is printed with a warning naming the rank
// and the job exits 0, instead of waiting for the kernel (forever on a dead mount).
func TestRunRankStuckAtExit(t *testing.T) {
	args := append([]string{"--storage", "file://" + t.TempDir(), "--storage-timeout", "200ms", "--fault", "storage-freeze:op=put"}, storageArgs...)
	defer panicAfter(2*time.Minute, "cpcache run with a rank stuck at its exit still running")()
	start := time.Now()
	status, rep, out, errOut := runBinary(t, []string{envTestExitHang + "=2"}, args...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Contains(t, errOut, "launch: warning: rank 2 exited with status 0 but did not end within 3s: a thread of it is stuck in the kernel (a frozen or hung file system?); leaving it behind")
	assert.Equal(t, 1, strings.Count(errOut, "warning: rank"), errOut)
	assert.Positive(t, rep.StorageAbandoned, "operations abandoned")
	t.Logf("%d requests, job %.2fs, cpcache run returned after %v", rep.Requests, rep.WallSeconds, time.Since(start))
}

// panicAfter panics with what, and how long it has waited, unless the function it returns is
// called within d: the bound of a test whose failure is a wait without end (the test binary's
// own -timeout would only fire after every other test's time too).
func panicAfter(d time.Duration, what string) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(d):
			panic(fmt.Sprintf("%s after %v", what, d))
		}
	}()
	return func() { close(done) }
}
