package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
)

// TestRunRedisClusterMasterKilled runs against a Redis Cluster (three masters, three
// replicas) and kills a master once the run has backed pages up: calls that need its slots
// fail (counted storage errors, each a miss or a skipped backup) and the circuit opens,
// the run finishes healthy, 0 bad pages; once its replica has taken over, a second run
// prefetches the first run's pages from the cluster, the victim's slots included.
func TestRunRedisClusterMasterKilled(t *testing.T) {
	c := redistest.StartCluster(t) // skips, saying why, without redis-server or redis-cli
	url := c.URL("killed") + "?timeout=1s"
	args := append([]string{"--storage", url, "--storage-insecure"}, storageArgs...)
	wait := startBinary(t, nil, append([]string{"--storage-clear"}, args...)...)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := c.DBSize()
		require.NoError(t, err)
		if n >= 100 || time.Now().After(deadline) {
			break
		}
	}
	victim := c.Masters()[0]
	victim.Kill()
	status, rep, out, errOut := wait()
	requireHealthy(t, status, rep, out, errOut)
	assert.Equal(t, int64(32), rep.Requests, "every request served")
	assert.Positive(t, rep.StorageErrors, "calls to the killed master's slots fail")
	assert.Positive(t, rep.StorageCircuitOpenSeconds, "the circuit opened")
	assert.Positive(t, rep.PagesBackedUp)
	first := rep

	c.WaitOK(20 * time.Second) // the victim's replica took over its slots
	status, rep, out, errOut = runBinary(t, nil, args...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Zero(t, rep.StorageErrors, "after the failover: %s", errOut)
	assert.Zero(t, rep.StorageRejected)
	assert.Positive(t, rep.TokensHitL3, "the second run hits the cluster")
	assert.Equal(t, rep.PagesLoadedL2, rep.PagesVerified)
	t.Logf("master %v killed mid-run: %d storage errors, circuit open %.2fs, %d pages backed up; after the failover: %d tokens of %d hit in storage, %d pages prefetched",
		victim, first.StorageErrors, first.StorageCircuitOpenSeconds, first.PagesBackedUp, rep.TokensHitL3, rep.InputTokens, rep.PagesPrefetched)
}
