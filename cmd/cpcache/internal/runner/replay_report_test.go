package runner

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
)

// inProcessReport runs p with every rank in this process (runInProcess) and builds the
// report rank 0 of `cpcache run` would (its consensus latencies are those of the in-process
// group).
func inProcessReport(t *testing.T, p *Plan) *report.Report {
	t.Helper()
	start := time.Now()
	out := runInProcess(t, p, -1)
	var results []rankResult
	for rank, o := range out {
		require.NoError(t, o.err, "rank %d", rank)
		r := rankResult{Rank: rank, DP: p.Layout.Coord(rank).DP, Leader: p.Layout.ReplicaGroup(rank)[0] == rank, Backend: "local",
			Replica: o.counts, Local: o.local, PagesWritten: o.stats.PagesWritten, PagesLoaded: o.stats.PagesLoaded,
			Collectives: int64(o.collectives), DigestChecks: o.stats.DigestChecks, DigestMismatches: o.stats.DigestMismatches,
			L3Prefetched: o.stats.L3PrefetchedPages, L3BackedUp: o.stats.L3BackedUpPages, StorageErrors: o.stats.StorageErrors,
			Timing: o.timing, Model: o.model}
		for _, d := range o.stats.ConsensusLatency {
			r.LatencyNs = append(r.LatencyNs, int64(d))
		}
		results = append(results, r)
	}
	rep := buildReport(p, results)
	rep.WallSeconds = time.Since(start).Seconds()
	return rep
}

// TestSweepReportInProcess: a sweep of L2 sizes over a small trace (World 4, CP 4), with the
// ranks in one process, builds the reports `cpcache run --sweep` would: in each, the hits per
// tier and the misses sum to the input tokens, the miss causes to the misses, the hit rate
// stays within the unlimited-cache bound and does not fall as L2 grows; the sweep's JSON
// holds every report and its HTML the sweep chart.
func TestSweepReportInProcess(t *testing.T) {
	trace := writeSmallTrace(t, 48)
	plan := func(l2 int) *Plan {
		cfg := DefaultConfig()
		cfg.Layout = parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4}
		cfg.Workload, cfg.TracePath = WorkloadTrace, trace
		cfg.PageSize, cfg.L1Pages, cfg.L2Pages, cfg.KVBytesPerToken = 16, 256, l2, 8
		cfg.Time.Cost, _ = LoadCostProfile("unit", "")
		p, err := Prepare(cfg)
		require.NoError(t, err)
		return p
	}
	sw := &report.SweepResult{Param: "l2-pages", Values: []string{"48", "128", "1024"}}
	for _, v := range sw.Values {
		l2, err := strconv.Atoi(v)
		require.NoError(t, err)
		rep := inProcessReport(t, plan(l2))
		assert.Equal(t, rep.InputTokens, rep.TokensHitL1+rep.TokensHitL2+rep.TokensHitL3+rep.TokensMissed, "l2-pages=%s", v)
		assert.Equal(t, rep.TokensMissed, rep.MissCauses.Total(), "l2-pages=%s: every miss has one cause", v)
		assert.LessOrEqual(t, rep.HitRate, rep.Reference.ReuseBoundHitRate+1e-9, "l2-pages=%s", v)
		assert.InDelta(t, 1, rep.CollectivesPerStep, 1e-9, "l2-pages=%s", v)
		if n := len(sw.Reports); n > 0 {
			assert.GreaterOrEqual(t, rep.HitRate, sw.Reports[n-1].HitRate, "l2-pages=%s: a larger L2 hits no less", v)
		}
		sw.Reports = append(sw.Reports, rep)
	}
	var table strings.Builder
	report.WriteSweepTable(&table, sw)
	assert.Equal(t, 1+len(sw.Values), strings.Count(table.String(), "\n"), "a header and a line per value:\n%s", table.String())

	var js bytes.Buffer
	require.NoError(t, report.WriteSweepJSON(&js, sw))
	var back report.SweepResult
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, sw.Values, back.Values)
	require.Len(t, back.Reports, len(sw.Values))
	assert.Equal(t, sw.Reports[2].TokensHitL2, back.Reports[2].TokensHitL2)

	var page bytes.Buffer
	require.NoError(t, report.WriteHTML(&page, sw.Reports[len(sw.Reports)-1], sw))
	assert.Contains(t, page.String(), `<figure id="`+report.ChartSweep+`" data-points="9">`, "three lines of three values")
}
