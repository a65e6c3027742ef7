package runner

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cpcache/cpcache/parallel"
)

// TestFlushWhenIdleIsMade flushes a CP4 replica at step 20 of a run that keeps it busy
// (6 conversations, requests running at every step): flush:step=20 is refused on every rank
// alike, flush:step=20,when=idle holds admissions until nothing runs and nothing is in
// flight, flushes and serves the rest, so the turns after it miss what the flush dropped.
func TestFlushWhenIdleIsMade(t *testing.T) {
	run := func(spec string) []rankOutcome {
		faults, err := ParseFaults(spec)
		if err != nil {
			t.Fatal(err)
		}
		p := smallPlan(t, parallel.LayoutConfig{World: 4, AttnCP: 4}, func(c *Config) { c.Faults = faults })
		out := runInProcess(t, p, -1)
		requireAgreed(t, p, out)
		return out
	}
	none := run("flush:step=100000") // never reached: the same run without a flush
	now := run("flush:step=20")
	idle := run("flush:step=20,when=idle")
	for rank := range 4 {
		assert.Equal(t, [2]int64{0, 1}, [2]int64{now[rank].counts.Flushes, now[rank].counts.FlushesRefused}, "rank %d: flushes made and refused, when=now", rank)
		assert.Equal(t, [2]int64{1, 0}, [2]int64{idle[rank].counts.Flushes, idle[rank].counts.FlushesRefused}, "rank %d: flushes made and refused, when=idle", rank)
	}
	hits := func(o rankOutcome) int64 { return o.counts.HitL1 + o.counts.HitL2 + o.counts.HitL3 }
	assert.Equal(t, hits(none[0]), hits(now[0]), "a refused flush changes nothing")
	assert.Less(t, hits(idle[0]), hits(none[0]), "the turns after the flush recompute what it dropped")
}
