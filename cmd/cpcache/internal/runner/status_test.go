package runner

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
		require.NoError(t, writeFileAtomic(dir, "status-"+string(rune('0'+s.Rank))+".json", s))
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
	assert.Contains(t, string(body), `cpcache_requests_done{job="cpcache-run"} 5`)
	assert.Contains(t, string(body), `cpcache_requests_total{job="cpcache-run"} 9`)
	assert.Contains(t, string(body), "# TYPE cpcache_bad_pages counter")
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
	for !strings.Contains(buf.String(), "4/4") {
		time.Sleep(time.Millisecond)
	}
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
