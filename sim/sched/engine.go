package sched

import (
	"context"
	"fmt"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/workload"
)

// Engine does the compute of the requests the scheduler serves (Scheduler.Engine; nil: the
// scheduler "computes" kvtest's synthetic bytes and checks every page loaded back against
// them). It is a model whose KV lives in the cache's L1 (per-layer buffers): a prefill reads
// the cached prefix from L1 after the layer-wise wait and computes only the tokens after it;
// each decode step computes one token; the pages an insert asks for are stored from the
// KV it computed. Every rank of a replica calls it with the same requests in the same order
// (replicated decisions), so an engine may make collectives over its CP group in each call.
type Engine interface {
	// Prompt returns r as the engine serves it: a synthetic conversation's turn holds the
	// answer the engine generated for the previous turn (the workload's prompt holds a
	// placeholder answer of the same length). Called before r is admitted, possibly more
	// than once; r's previous turn, if any, has finished.
	Prompt(r workload.Request) (workload.Request, error)
	// Prefill computes r's prompt after its first len(prefix) pages, which are cached in L1
	// at slots prefix (each rank reads the pages it owns). When pages of the prefix were
	// loaded back from L2, wait is not nil and the prefill calls wait(layer) before a layer
	// reads the prefix (the layer-wise wait). With OutputLen > 0 it produces the first token.
	Prefill(ctx context.Context, r workload.Request, prefix []int32, wait func(layer int) error) error
	// Decode computes r's next token.
	Decode(ctx context.Context, r workload.Request) error
	// Answer is what r generated so far.
	Answer(r workload.Request) []int32
	// FillPage stores the KV of page index of r's sequence (prompt and answer), which this
	// rank owns, into L1 slot slot: a page an insert asked to fill.
	FillPage(r workload.Request, slot int32, index int) error
	// Finish is called once r was inserted with its answer: the engine compares r's output
	// with the same request computed without the cache (ErrOutputDiffers in diff when they
	// differ) and forgets r. err is a failure of the engine itself.
	Finish(ctx context.Context, r workload.Request) (diff error, err error)
}

// ErrOutputDiffers is wrapped by an Engine's Finish diff: a request's output with the cache
// differs from the output without it.
var ErrOutputDiffers = fmt.Errorf("sched: output differs from the cache-off run")

// answer is r's answer: the engine's, else the workload's deterministic one.
func (s *Scheduler) answer(r workload.Request) []int32 {
	if s.Engine != nil {
		return s.Engine.Answer(r)
	}
	return workload.Answer(r)
}

// outputChecked counts the output check of r (diff: how it differs, or nil).
func (s *Scheduler) outputChecked(diff error) {
	s.counts.OutputsChecked++
	if diff != nil {
		s.counts.OutputsDiffering++
		if s.firstBad == nil {
			s.firstBad = diff
		}
	}
}

// computePrompt runs the engine's prefill of r after its load-back: match m before it,
// after once it is over. The prefix it reads from L1 is after's device pages but, when they
// hold the whole prompt, its last page: at least the last prompt token is computed, since
// its logits give the first token. When pages were loaded the prefill waits for each layer
// of them (WaitL1Layer) before it reads that layer.
func (s *Scheduler) computePrompt(ctx context.Context, r workload.Request, m, after hicache.MatchResult) error {
	P := s.cfg.PageSize
	usable := min(after.DevicePages, max(len(r.Tokens)-1, 0)/P)
	var wait func(layer int) error
	if after.DevicePages > m.DevicePages { // pages were loaded
		wait = func(layer int) error {
			if err := s.cache.WaitL1Layer(ctx, after.Last, layer); err != nil {
				return fmt.Errorf("sched: request %d: layer %d: %w", r.ID, layer, err)
			}
			s.local.LayerWaits++
			return nil
		}
	}
	if err := s.Engine.Prefill(ctx, r, after.L1Slots[:usable], wait); err != nil {
		return fmt.Errorf("sched: request %d: prefill: %w", r.ID, err)
	}
	return nil
}
