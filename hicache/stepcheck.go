package hicache

import (
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/parallel"
)

// DefaultStepWarnAfter is how long transfers or storage operations may stay pending with no
// Step before the cache warns that nothing starts them (Config.StepWarnAfter).
const DefaultStepWarnAfter = 5 * time.Second

// The driver's slots of the consensus vector, after the core's: each rank's step ordinal
// and its count of replicated calls since its last step, so that ranks that call Step a
// different number of times, or make different calls between steps, are named with both
// counts. Each travels twice, packed with the group rank in the low bits: one MIN gives the
// lowest value and the lowest rank that has it, the other the highest and its lowest rank.
const (
	vStepLo   = core.VectorLen + iota // step<<skewRankBits | rank
	vStepHi                           // (skewTop-step)<<skewRankBits | rank
	vCallsLo                          // calls<<skewRankBits | rank
	vCallsHi                          // (skewTop-calls)<<skewRankBits | rank
	vectorLen                         // the driver's vector: the core's and these
)

const (
	skewRankBits = 20      // group ranks below 1<<20
	skewTop      = 1 << 42 // counts are clamped below it
)

func packLo(x uint64, rank int) int64 {
	return int64(min(x, skewTop-1)<<skewRankBits | uint64(rank))
}

func packHi(x uint64, rank int) int64 {
	return int64((skewTop-min(x, skewTop-1))<<skewRankBits | uint64(rank))
}

func unpackLo(v int64) (x uint64, rank int) {
	return uint64(v) >> skewRankBits, int(v & (1<<skewRankBits - 1))
}

func unpackHi(v int64) (x uint64, rank int) {
	return skewTop - uint64(v)>>skewRankBits, int(v & (1<<skewRankBits - 1))
}

// fillSkewLocked writes this rank's step ordinal and replicated calls into v's driver slots.
func (c *Cache) fillSkewLocked(v []int64, step uint64, calls uint64) {
	r := c.group.Rank()
	v[vStepLo], v[vStepHi] = packLo(step, r), packHi(step, r)
	v[vCallsLo], v[vCallsHi] = packLo(calls, r), packHi(calls, r)
}

// skewCause names, from the agreed vector, the ranks whose step ordinals or replicated calls
// since their last step differ, or returns "" when every rank's are equal.
func (c *Cache) skewCause(v []int64) string {
	ranks := c.group.Ranks()
	lo, loRank := unpackLo(v[vStepLo])
	hi, hiRank := unpackHi(v[vStepHi])
	if lo != hi {
		return fmt.Sprintf("rank %d has called step() %d times, rank %d %d times: every rank must call step() the same number of times",
			ranks[hiRank], hi+1, ranks[loRank], lo+1)
	}
	step := lo
	lo, loRank = unpackLo(v[vCallsLo])
	hi, hiRank = unpackHi(v[vCallsHi])
	if lo != hi {
		return fmt.Sprintf("at its step() call #%d rank %d had made %d replicated calls since its previous step(), rank %d had made %d: "+
			"every rank must make the same calls between steps and call step() the same number of times "+
			"(an extra step() on one rank meets its peers' next step, made after their calls)",
			step+1, ranks[loRank], lo, ranks[hiRank], hi)
	}
	return ""
}

// replicatedCall is replicable for the scheduler's replicated calls other than Step: it
// counts the call (the step's vector carries the count) and watches for I/O left pending
// with no Step.
func (c *Cache) replicatedCall() error {
	if err := c.replicable(); err != nil {
		return err
	}
	c.calls++
	c.watchStepLocked()
	return nil
}

// stepWatch notices transfers or storage operations pending for longer than after with no
// Step: they start only at a step, so a scheduler that never steps waits for them forever.
// It is checked at the scheduler's calls (replicated calls and the pending queries a wait
// loop makes), which needs no goroutine: a rank that makes no call has nothing to be told.
type stepWatch struct {
	after    time.Duration // 0: never warn
	log      func(error)   // nil: the standard logger
	lastCall time.Time     // the previous call or step checked
	since    time.Time     // work pending since (at most), with no step since; zero: none seen
	counted  bool          // this stretch of pending work was counted
	warned   bool          // the warning was logged (once per cache)
	count    int64         // stretches of pending work that outlasted after with no step
}

// watchStepLocked checks the pending work against the watch; c.mu is held.
func (c *Cache) watchStepLocked() {
	w := &c.watch
	if w.after <= 0 {
		return
	}
	now := time.Now()
	last := w.lastCall
	w.lastCall = now
	n := c.core.Pending()
	if n == 0 {
		w.since, w.counted = time.Time{}, false
		return
	}
	if w.since.IsZero() {
		// The work appeared at the previous call at the earliest (or now, at the first).
		w.since = now
		if !last.IsZero() {
			w.since = last
		}
	}
	if w.counted || now.Sub(w.since) < w.after {
		return
	}
	w.counted = true
	w.count++
	if w.warned {
		return
	}
	w.warned = true
	err := fmt.Errorf("hicache: warning: %d transfers or storage operations have been pending for %v on group %s with no step() on this rank: "+
		"copies and storage I/O start only at a step, so call step() once per scheduler step on every rank "+
		"(warned once per cache; each time is counted: Stats.NoStepWarnings, no_step_warnings)", n, now.Sub(w.since).Round(time.Millisecond), c.group.Name())
	if w.log != nil {
		w.log(err)
		return
	}
	log.Print(err)
}

// steppedLocked records a step for the watch: pending work is new again from here.
func (c *Cache) steppedLocked() {
	w := &c.watch
	w.lastCall, w.since, w.counted = time.Now(), time.Time{}, false
}

// stepError is the error of a step whose collective failed. When the backend knows how many
// collectives the missing ranks had entered (parallel.NotArrivedError), it names their step
// counts beside this rank's: a rank that calls step() more often than its peers waits here.
func (c *Cache) stepError(step uint64, err error) error {
	if errors.Is(err, parallel.ErrMismatch) {
		return fmt.Errorf("hicache: consensus step %d on group %s: a rank made another collective (a flush) where this rank made its step() call #%d: "+
			"every rank must call step() the same number of times, with the same calls between steps: %w", step, c.group.Name(), step+1, err)
	}
	var na *parallel.NotArrivedError
	if !errors.As(err, &na) || len(na.Missing) == 0 {
		return fmt.Errorf("hicache: consensus step %d on group %s: %w", step, c.group.Name(), err)
	}
	ranks := c.group.Ranks()
	byCount := map[uint64][]int{}
	for i, r := range na.Missing {
		behind := na.Seq + 1 - na.Entered[i] // collectives this rank entered beyond r's (this one included)
		n := step + 1 - min(behind, step+1)
		byCount[n] = append(byCount[n], ranks[r])
	}
	counts := make([]uint64, 0, len(byCount))
	for n := range byCount {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	var b strings.Builder
	for i, n := range counts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s called step() %d times", rankList(byCount[n]), hasHave(len(byCount[n])), n)
	}
	late := ""
	if errors.Is(err, parallel.ErrTimeout) {
		late = ", or a rank is late"
	}
	return fmt.Errorf("hicache: consensus step %d on group %s: %s, this rank %d times (counting collectives): "+
		"every rank must call step() the same number of times%s: %w", step, c.group.Name(), b.String(), step+1, late, err)
}

func hasHave(n int) string {
	if n == 1 {
		return "has"
	}
	return "have"
}

// rankList names ranks compactly: "rank 3", "ranks 1-3", "ranks 1, 4, 6".
func rankList(ranks []int) string {
	slices.Sort(ranks)
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	if ranks[len(ranks)-1]-ranks[0] == len(ranks)-1 {
		return fmt.Sprintf("ranks %d-%d", ranks[0], ranks[len(ranks)-1])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s, ", ")
}
