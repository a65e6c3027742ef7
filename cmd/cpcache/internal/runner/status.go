package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cpcache/cpcache/hicache"
)

const (
	reportFile     = "report.json"
	statusInterval = 250 * time.Millisecond
)

// rankStatus is one rank's status file.
type rankStatus struct {
	Rank         int   `json:"rank"`
	Leader       bool  `json:"leader"`
	Total        int64 `json:"total"`
	Done         int64 `json:"done"`
	InputTokens  int64 `json:"input_tokens"`
	HitTokens    int64 `json:"hit_tokens"`
	Steps        int64 `json:"steps"`
	PagesWritten int64 `json:"pages_written"`
	PagesLoaded  int64 `json:"pages_loaded"`
	BadPages     int64 `json:"bad_pages"`
}

func statusPath(dir, name string) string { return filepath.Join(dir, name) }

// startReporting starts what a rank shows while it runs: its status and metrics files when
// out has a status directory (every rank), else progress and metrics (reg, plus this
// process's Go and process collectors) on rank 0. stop ends it (after a last status write).
func startReporting(ctx context.Context, rank int, leader bool, l *live, cache *hicache.Cache, reg prometheus.Gatherer, out Output) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	refresh := func() {
		st := cache.Stats()
		l.pagesWritten.Store(st.PagesWritten)
		l.pagesLoaded.Store(st.PagesLoaded)
	}
	switch {
	case out.StatusDir != "":
		write := func() {
			refresh()
			_ = writeFileAtomic(out.StatusDir, fmt.Sprintf("status-%d.json", rank), l.status(rank, leader))
			_ = writeMetricsFile(out.StatusDir, rank, reg)
		}
		wg.Add(1)
		go func() { defer wg.Done(); every(ctx, statusInterval, write, true) }()
	case rank == 0:
		if out.MetricsAddr != "" {
			addr, err := serveMetrics(ctx, out.MetricsAddr, prometheus.Gatherers{servingRegistry(), reg})
			if err != nil {
				cancel()
				return nil, err
			}
			if out.Progress != nil {
				fmt.Fprintf(out.Progress, "metrics: http://%s/metrics (rank 0, replica 0)\n", addr)
			}
		}
		if out.Progress != nil {
			wg.Add(2)
			go func() { defer wg.Done(); every(ctx, statusInterval, refresh, false) }()
			go func() { defer wg.Done(); progress(ctx, out.Progress, out.Terminal, l, time.Second) }()
		}
	}
	return func() { cancel(); wg.Wait() }, nil
}

// every calls fn at each tick of interval until ctx ends, and once more then when last.
func every(ctx context.Context, interval time.Duration, fn func(), last bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if last {
				fn()
			}
			return
		case <-t.C:
			fn()
		}
	}
}

// Watcher shows the progress of a job whose ranks write status files into a directory:
// a bar (or plain lines) and, optionally, the ranks' Prometheus metrics (from their metrics
// files) with this process's Go and process collectors.
type Watcher struct {
	dir  string
	l    live
	addr string // metrics address actually listened on ("": none)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewWatcher starts watching dir for a job of total requests. With metricsAddr it listens
// at once (so a bad address is an error before any rank starts) and serves /metrics until
// Close.
func NewWatcher(dir string, total int, metricsAddr string) (*Watcher, error) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{dir: dir, cancel: cancel}
	w.l.total.Store(int64(total))
	if metricsAddr != "" {
		addr, err := serveMetrics(ctx, metricsAddr, prometheus.Gatherers{servingRegistry(), statusDirGatherer(dir)})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		w.addr = addr
	}
	w.wg.Add(1)
	go func() { defer w.wg.Done(); every(ctx, statusInterval, w.refresh, false) }()
	return w, nil
}

// MetricsAddr is the address /metrics is served on ("" without metrics).
func (w *Watcher) MetricsAddr() string { return w.addr }

// Progress draws progress to out until ctx ends (a bar redrawn in place on a terminal,
// plain lines otherwise).
func (w *Watcher) Progress(ctx context.Context, out io.Writer, terminal bool) {
	progress(ctx, out, terminal, &w.l, time.Second)
}

// refresh sums the status files: replica counters over replica leaders, page counters over
// every rank.
func (w *Watcher) refresh() {
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return
	}
	var sum rankStatus
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "status-") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(statusPath(w.dir, e.Name()))
		if err != nil {
			continue
		}
		var s rankStatus
		if json.Unmarshal(b, &s) != nil {
			continue
		}
		if s.Leader {
			sum.Done += s.Done
			sum.InputTokens += s.InputTokens
			sum.HitTokens += s.HitTokens
			sum.Steps += s.Steps
		}
		sum.PagesWritten += s.PagesWritten
		sum.PagesLoaded += s.PagesLoaded
		sum.BadPages += s.BadPages
	}
	w.l.done.Store(sum.Done)
	w.l.inputTokens.Store(sum.InputTokens)
	w.l.hitTokens.Store(sum.HitTokens)
	w.l.steps.Store(sum.Steps)
	w.l.pagesWritten.Store(sum.PagesWritten)
	w.l.pagesLoaded.Store(sum.PagesLoaded)
	w.l.badPages.Store(sum.BadPages)
}

// Close stops watching, after a last refresh. Nil-safe and idempotent.
func (w *Watcher) Close() error {
	if w == nil || w.cancel == nil {
		return nil
	}
	w.refresh()
	w.cancel()
	w.wg.Wait()
	w.cancel = nil
	return nil
}
