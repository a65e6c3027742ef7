package runner

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache/metrics"
)

// TestWatcherSumsStatusFilesAndServesMetrics: the progress sums the ranks' status files;
// /metrics serves every rank's metrics file, each with its labels, and the watcher's own
// Go and process collectors.
func TestWatcherSumsStatusFilesAndServesMetrics(t *testing.T) {
	dir := t.TempDir()
	// Two replicas of two ranks: replica counts come from the leaders only, page counts
	// from every rank.
	for _, s := range []rankStatus{
		{Rank: 0, Leader: true, Done: 3, InputTokens: 100, HitTokens: 40, Steps: 7, PagesWritten: 5, PagesLoaded: 2},
		{Rank: 1, Leader: false, Done: 3, InputTokens: 100, HitTokens: 40, Steps: 7, PagesWritten: 6, PagesLoaded: 1},
		{Rank: 2, Leader: true, Done: 2, InputTokens: 50, HitTokens: 10, Steps: 5, PagesWritten: 1, BadPages: 1},
		{Rank: 3, Leader: false, Done: 2, InputTokens: 50, HitTokens: 10, Steps: 5},
	} {
		require.NoError(t, writeFileAtomic(dir, "status-"+strconv.Itoa(s.Rank)+".json", s))
		var l live
		l.done.Store(s.Done)
		l.inputTokens.Store(s.InputTokens)
		reg := prometheus.NewRegistry()
		reg.MustRegister(liveCollectors(&l, metrics.Labels{Rank: s.Rank, Replica: s.Rank / 2, SlabGroup: s.Rank % 2}.Labels())...)
		require.NoError(t, writeMetricsFile(dir, s.Rank, reg))
	}
	w, err := NewWatcher(dir, 9, "127.0.0.1:0")
	require.NoError(t, err)
	defer w.Close()
	w.refresh()
	assert.Equal(t, int64(5), w.l.done.Load())
	assert.Equal(t, int64(150), w.l.inputTokens.Load())
	assert.InDelta(t, 50.0/150, w.l.hitRate(), 1e-9)
	assert.Equal(t, int64(12), w.l.pagesWritten.Load())
	assert.Equal(t, int64(1), w.l.badPages.Load())

	resp, err := http.Get("http://" + w.MetricsAddr() + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Contains(t, string(body), `cpcache_run_requests_done_total{rank="2",replica="1",slab_group="0"} 2`)
	assert.Contains(t, string(body), `cpcache_run_prompt_tokens_total{rank="1",replica="0",slab_group="1"} 100`)
	assert.Contains(t, string(body), "# TYPE cpcache_run_bad_pages_total counter")
	assert.Contains(t, string(body), "go_goroutines ")
	assert.Contains(t, string(body), "process_cpu_seconds_total ")
	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "idempotent")
	var nilW *Watcher
	assert.NoError(t, nilW.Close())
}

func TestWatcherRejectsABadMetricsAddress(t *testing.T) {
	_, err := NewWatcher(t.TempDir(), 1, "no-such-host-or-port")
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "no-such-host-or-port")
}

func TestProgressPlainLinesWhenNotATerminal(t *testing.T) {
	assert.Equal(t, "[###############...............] 5/10 requests, hit rate 50.0%", progressLine(5, 10, 0.5))
	assert.Equal(t, "[..............................] 0/0 requests, hit rate 0.0%", progressLine(0, 0, 0))
	var l live
	l.total.Store(4)
	l.done.Store(4)
	var buf lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); progress(ctx, &buf, false, &l, time.Millisecond) }()
	require.Eventually(t, func() bool { return strings.Contains(buf.String(), "4/4") }, 10*time.Second, time.Millisecond,
		"the progress line of 4/4 requests: %q", buf.String())
	cancel()
	<-done
	assert.NotContains(t, buf.String(), "\r", "no carriage returns off a terminal")
	assert.Equal(t, 1, strings.Count(buf.String(), "\n"), "one line per change: %q", buf.String())
}

// lockedBuffer is a bytes.Buffer safe for one writer goroutine and a reading test.
type lockedBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
