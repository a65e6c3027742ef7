package runner

import (
	"slices"
	"sync"
	"time"

	"github.com/cpcache/cpcache/hicache"
)

// timedEngine wraps an Engine and measures, per direction, the bytes its transfers moved
// and the time it was busy with them (the union of the intervals from Submit to the
// ticket's completion), so the report can state the copy bandwidth achieved.
type timedEngine struct {
	inner     hicache.Engine
	pageBytes int
	wg        sync.WaitGroup // one per ticket being watched

	mu    sync.Mutex      // protects spans
	spans [2][]copyPeriod // by hicache.Kind
}

type copyPeriod struct {
	start, end time.Time
	bytes      int64
}

// copyTotal is one direction's bytes and busy time.
type copyTotal struct {
	bytes int64
	busy  time.Duration
}

func newTimedEngine(inner hicache.Engine, pageBytes int) *timedEngine {
	return &timedEngine{inner: inner, pageBytes: pageBytes}
}

// Submit implements hicache.Engine.
func (e *timedEngine) Submit(t hicache.Transfer) *hicache.Ticket {
	start := time.Now()
	tk := e.inner.Submit(t)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		<-tk.Done()
		if tk.Err() != nil {
			return
		}
		p := copyPeriod{start: start, end: time.Now(), bytes: int64(len(t.Copies)) * int64(e.pageBytes)}
		e.mu.Lock()
		e.spans[t.Kind] = append(e.spans[t.Kind], p)
		e.mu.Unlock()
	}()
	return tk
}

// Cancel implements hicache.Engine.
func (e *timedEngine) Cancel() { e.inner.Cancel() }

// Close implements hicache.Engine: it closes the inner engine, which finishes every ticket.
func (e *timedEngine) Close() error {
	if e == nil {
		return nil
	}
	err := e.inner.Close()
	e.wg.Wait()
	return err
}

// busy returns the totals of backups (L1 → L2) and loads (L2 → L1) so far.
func (e *timedEngine) busy() (write, load copyTotal) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return unionTotal(e.spans[hicache.Write]), unionTotal(e.spans[hicache.Load])
}

// unionTotal sums the bytes of spans and the length of the union of their intervals.
func unionTotal(spans []copyPeriod) copyTotal {
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b copyPeriod) int { return a.start.Compare(b.start) })
	var t copyTotal
	var end time.Time
	for _, p := range s {
		t.bytes += p.bytes
		if p.start.After(end) {
			end = p.start
		}
		if p.end.After(end) {
			t.busy += p.end.Sub(end)
			end = p.end
		}
	}
	return t
}
