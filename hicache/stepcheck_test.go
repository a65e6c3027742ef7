package hicache

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// warnings collects each rank's warnings (Config.Log).
type warnings struct {
	mu   sync.Mutex
	msgs map[int][]string
}

func (w *warnings) log(rank int) func(error) {
	return func(err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.msgs[rank] = append(w.msgs[rank], err.Error())
	}
}

func (w *warnings) of(rank int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs[rank]...)
}

func twoRankRig(t *testing.T, rc rigConfig) *rig {
	rc.layout = parallel.LayoutConfig{World: 2, AttnCP: 2}
	rc.opts = Options{PageSize: 4, L1Pages: 8, Policy: WriteThrough, MinLoadPages: 1, LoadQuotaPages: 16}
	rc.pagesPerSlab, rc.pageBytes = 32, 64
	return newRig(t, rc)
}

// pollPending calls Pending on every rank for d, as a scheduler's wait loop without a Step
// would.
func pollPending(r *rig, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, c := range r.caches {
			c.Pending()
		}
	}
}

// A scheduler that inserts (backups pending) and never steps is told, once per cache and
// naming step(), and each stretch is counted; an L1-full error while copies are pending
// says that they start only at a step.
func TestForgottenStepWarnsOnceAndCounts(t *testing.T) {
	w := &warnings{msgs: map[int][]string{}}
	r := twoRankRig(t, rigConfig{stepWarnAfter: 100 * time.Millisecond, log: w.log})
	if _, err := r.insert(tokensN(0, 16)); err != nil {
		t.Fatal(err)
	}
	if p := r.caches[0].Pending(); p == 0 {
		t.Fatal("an insert under write-through left no backup pending")
	}
	pollPending(r, 400*time.Millisecond)
	for i, c := range r.caches {
		msgs := w.of(i)
		if len(msgs) != 1 || !strings.Contains(msgs[0], "no step() on this rank") || !strings.Contains(msgs[0], "start only at a step") {
			t.Fatalf("rank %d: warnings %q, want one naming step()", i, msgs)
		}
		if n := c.Stats().NoStepWarnings; n != 1 {
			t.Fatalf("rank %d: NoStepWarnings %d, want 1", i, n)
		}
	}
	// L1 fills up: nothing can be evicted while its backup waits for a step.
	var err error
	for k := int32(1); k < 10 && err == nil; k++ {
		_, err = r.insert(tokensN(100*k, 16))
	}
	if !errors.Is(err, ErrL1Full) || !strings.Contains(err.Error(), "copies start only at the next step()") {
		t.Fatalf("insert into a full L1 with backups pending: %v, want ErrL1Full saying copies start at the next step()", err)
	}
	// Stepping ends the stretch; a second one is counted, not logged again.
	r.drain()
	if _, err := r.insert(tokensN(5000, 8)); err != nil {
		t.Fatal(err)
	}
	pollPending(r, 400*time.Millisecond)
	for i, c := range r.caches {
		if n, msgs := c.Stats().NoStepWarnings, w.of(i); n != 2 || len(msgs) != 1 {
			t.Fatalf("rank %d: NoStepWarnings %d and %d warnings after a second stretch, want 2 and 1", i, n, len(msgs))
		}
	}
	// A scheduler that steps is never warned, however long the copies take.
	r.drain()
	if _, err := r.insert(tokensN(6000, 8)); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		pollPending(r, 10*time.Millisecond)
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.caches[0].Stats().NoStepWarnings; n != 2 {
		t.Fatalf("NoStepWarnings %d while stepping, want still 2", n)
	}
}

// One rank calls Step once more than its peers, whose next step follows their next calls:
// the collectives meet (they are matched by order) and the digests differ; the error names
// the calls each made since its previous step and says that every rank must step alike.
func TestExtraStepMeetsPeersNextStepAndIsNamed(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 4, AttnCP: 4},
		opts:         Options{PageSize: 4, L1Pages: 16, Policy: WriteThrough, MinLoadPages: 1, LoadQuotaPages: 16},
		pagesPerSlab: 32, pageBytes: 64})
	if _, err := r.insert(tokensN(0, 16)); err != nil {
		t.Fatal(err)
	}
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	errs := r.all(func(i int) error {
		c := r.caches[i]
		if i == 0 {
			return c.Step(context.Background()) // the extra step
		}
		if _, err := c.Insert(Request{Tokens: tokensN(100, 8)}); err != nil {
			return err
		}
		if _, err := c.Match(Request{Tokens: tokensN(0, 16)}); err != nil {
			return err
		}
		return c.Step(context.Background())
	})
	want := regexp.MustCompile(`at its step\(\) call #2 rank 0 had made 0 replicated calls since its previous step\(\), rank 1 had made 2: every rank must make the same calls between steps and call step\(\) the same number of times`)
	t.Logf("rank 0: %v", errs[0])
	for i, err := range errs {
		var de *DivergedError
		if !errors.As(err, &de) || !want.MatchString(err.Error()) {
			t.Fatalf("rank %d: %v, want a DivergedError matching %q", i, err, want)
		}
	}
}

// One rank calls Step once more than its peers, which then make no collective: the rank
// waits, and the error names each rank's count of step() calls, at the deadline; when the
// peers leave instead, at once.
func TestExtraStepWaitingForPeersNamesTheCounts(t *testing.T) {
	for _, leave := range []bool{false, true} {
		r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 4, AttnCP: 4},
			opts:         Options{PageSize: 4, L1Pages: 16, Policy: WriteThrough, MinLoadPages: 1, LoadQuotaPages: 16},
			pagesPerSlab: 32, pageBytes: 64, shm: true, timeout: 20 * time.Second})
		for range 3 {
			if err := r.step(); err != nil {
				t.Fatal(err)
			}
		}
		timeout := 20 * time.Second
		if !leave {
			timeout = 500 * time.Millisecond
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			done <- r.caches[0].Step(ctx)
		}()
		if leave {
			time.Sleep(100 * time.Millisecond) // rank 0 waits in its step
			for _, g := range r.counted[1:] {
				g.Close()
			}
		}
		err := <-done
		took := time.Since(start)
		t.Logf("leave=%v after %v: %v", leave, took.Round(time.Millisecond), err)
		want := "ranks 1-3 have called step() 3 times, this rank 4 times (counting collectives): every rank must call step() the same number of times"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("leave=%v: %v, want an error naming %q", leave, err, want)
		}
		if leave && (!errors.Is(err, parallel.ErrPeerLost) || took > 5*time.Second) {
			t.Fatalf("leave=%v: %v after %v, want ErrPeerLost at once", leave, err, took)
		}
		if !leave && !errors.Is(err, parallel.ErrTimeout) {
			t.Fatalf("leave=%v: %v, want ErrTimeout", leave, err)
		}
	}
}

// An extra step on one rank that meets its peer's flush (shm compares the collectives) says
// so in the step's terms.
func TestExtraStepMeetingAFlushIsNamed(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 2, AttnCP: 2},
		opts:         Options{PageSize: 4, L1Pages: 16, Policy: WriteThrough, MinLoadPages: 1, LoadQuotaPages: 16},
		pagesPerSlab: 32, pageBytes: 64, shm: true})
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	errs := r.all(func(i int) error {
		if i == 0 {
			return r.caches[0].Step(context.Background())
		}
		return r.caches[1].Flush(context.Background())
	})
	want := "a rank made another collective (a flush) where this rank made its step() call #2: every rank must call step() the same number of times"
	if !errors.Is(errs[0], parallel.ErrMismatch) || !strings.Contains(errs[0].Error(), want) {
		t.Fatalf("rank 0: %v, want ErrMismatch naming %q", errs[0], want)
	}
	if !errors.Is(errs[1], parallel.ErrMismatch) {
		t.Fatalf("rank 1's flush: %v, want ErrMismatch", errs[1])
	}
}

// The step ordinals travel with the group rank of the lowest and of the highest: ranks whose
// ordinals differ are named with both counts.
func TestSkewSlotsNameTheRanks(t *testing.T) {
	r := twoRankRig(t, rigConfig{})
	c := r.caches[0]
	v := make([]int64, vectorLen)
	other := make([]int64, vectorLen)
	c.fillSkewLocked(v, 11, 3)
	r.caches[1].fillSkewLocked(other, 12, 0)
	parallel.Min.Apply(v, other)
	want := "rank 1 has called step() 13 times, rank 0 12 times: every rank must call step() the same number of times"
	if got := c.skewCause(v); got != want {
		t.Fatalf("skewCause: %q, want %q", got, want)
	}
	c.fillSkewLocked(v, 12, 3)
	parallel.Min.Apply(v, other)
	if got := c.skewCause(v); !strings.Contains(got, "at its step() call #13 rank 1 had made 0 replicated calls since its previous step(), rank 0 had made 3") {
		t.Fatalf("skewCause: %q", got)
	}
	c.fillSkewLocked(v, 12, 0)
	parallel.Min.Apply(v, other)
	if got := c.skewCause(v); got != "" {
		t.Fatalf("skewCause of equal counts: %q, want none", got)
	}
}
