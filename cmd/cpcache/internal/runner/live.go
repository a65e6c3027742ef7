package runner

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/workload"
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

// Matched implements sched.Observer.
func (l *live) Matched(workload.Request, hicache.MatchResult) {}

// Prefilled implements sched.Observer: the prompt tokens and those served from the cache.
func (l *live) Prefilled(p sched.Prefill) {
	l.inputTokens.Add(int64(len(p.Request.Tokens)))
	l.hitTokens.Add(p.L1 + p.L2 + p.L3)
}

// Finished implements sched.Observer.
func (l *live) Finished(workload.Request) { l.done.Add(1) }

// Stepped implements sched.Observer.
func (l *live) Stepped(steps int64) { l.steps.Store(steps) }

// BadPage implements sched.Observer.
func (l *live) BadPage() { l.badPages.Add(1) }

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
