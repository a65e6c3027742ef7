package runner

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// live holds counters that change while a rank runs; the metrics endpoint and the progress
// display read them from other goroutines.
type live struct {
	total        atomic.Int64
	done         atomic.Int64
	inputTokens  atomic.Int64
	hitTokens    atomic.Int64
	steps        atomic.Int64
	pagesWritten atomic.Int64
	pagesLoaded  atomic.Int64
	badPages     atomic.Int64
}

func (l *live) hitRate() float64 {
	in := l.inputTokens.Load()
	if in == 0 {
		return 0
	}
	return float64(l.hitTokens.Load()) / float64(in)
}

func (l *live) status(rank int, leader bool) rankStatus {
	return rankStatus{
		Rank: rank, Leader: leader, Total: l.total.Load(), Done: l.done.Load(),
		InputTokens: l.inputTokens.Load(), HitTokens: l.hitTokens.Load(), Steps: l.steps.Load(),
		PagesWritten: l.pagesWritten.Load(), PagesLoaded: l.pagesLoaded.Load(), BadPages: l.badPages.Load(),
	}
}

// writeMetrics writes the counters in the Prometheus text exposition format, each with the
// given labels (`rank="0"`, or `job="cpcache-run"` for a whole job).
func (l *live) writeMetrics(w io.Writer, labels string) {
	metric := func(name, help, kind string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %g\n", name, help, name, kind, name, labels, v)
	}
	metric("cpcache_requests_total", "Requests in the workload (of this replica, for a rank).", "gauge", float64(l.total.Load()))
	metric("cpcache_requests_done", "Requests finished.", "counter", float64(l.done.Load()))
	metric("cpcache_input_tokens", "Prompt tokens of finished prefills.", "counter", float64(l.inputTokens.Load()))
	metric("cpcache_hit_tokens", "Prompt tokens served from the cache (L1, L2 or storage).", "counter", float64(l.hitTokens.Load()))
	metric("cpcache_scheduler_steps", "Scheduler steps (one consensus each).", "counter", float64(l.steps.Load()))
	metric("cpcache_l2_pages_written", "Pages written into L2 slabs by this rank.", "counter", float64(l.pagesWritten.Load()))
	metric("cpcache_l2_pages_loaded", "Pages loaded back from L2 by this rank.", "counter", float64(l.pagesLoaded.Load()))
	metric("cpcache_bad_pages", "Loaded pages whose bytes were wrong.", "counter", float64(l.badPages.Load()))
}

// serveMetrics serves /metrics on addr until ctx ends. The listener is opened before it
// returns, so a bad or busy address is reported at once.
func serveMetrics(ctx context.Context, addr string, l *live, labels string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("runner: metrics address %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		l.writeMetrics(w, labels)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return ln.Addr().String(), nil
}

// progressLine renders "[#####.....] 120/192 requests, hit rate 61.2%".
func progressLine(done, total int64, hitRate float64) string {
	const width = 30
	filled := 0
	if total > 0 {
		filled = int(width * min(done, total) / total)
	}
	return fmt.Sprintf("[%s%s] %d/%d requests, hit rate %.1f%%",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, 100*hitRate)
}

// progress reports l every interval until ctx ends: a bar redrawn in place on a terminal,
// plain lines otherwise.
func progress(ctx context.Context, w io.Writer, terminal bool, l *live, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := int64(-1)
	for {
		select {
		case <-ctx.Done():
			if terminal {
				fmt.Fprintf(w, "\r%s\n", progressLine(l.done.Load(), l.total.Load(), l.hitRate()))
			}
			return
		case <-t.C:
		}
		done := l.done.Load()
		if terminal {
			fmt.Fprintf(w, "\r%s", progressLine(done, l.total.Load(), l.hitRate()))
		} else if done != last {
			fmt.Fprintf(w, "progress: %s\n", progressLine(done, l.total.Load(), l.hitRate()))
		}
		last = done
	}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
