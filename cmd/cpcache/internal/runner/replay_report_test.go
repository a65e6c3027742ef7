package runner

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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
			Timing: o.timing}
		for _, d := range o.stats.ConsensusLatency {
			r.LatencyNs = append(r.LatencyNs, int64(d))
		}
		results = append(results, r)
	}
	rep := buildReport(p, results)
	rep.WallSeconds = time.Since(start).Seconds()
	return rep
}

// TestReplaySweepInProcess measures what README's sweep shows, with the ranks in one
// process: CPCACHE_REPLAY_TRACE=conversation_trace.jsonl CPCACHE_REPLAY_OUT=dir
// [CPCACHE_REPLAY_REQUESTS=N] [CPCACHE_REPLAY_STORAGE=l2pages] go test -run
// TestReplaySweepInProcess -v -timeout 2h. It writes the sweep's JSON and HTML into the
// directory; with CPCACHE_REPLAY_STORAGE it instead compares synchronous and overlapped
// prefetch with an in-memory storage below that many L2 pages. Minutes to an hour on 2 cores.
func TestReplaySweepInProcess(t *testing.T) {
	trace, dir := os.Getenv("CPCACHE_REPLAY_TRACE"), os.Getenv("CPCACHE_REPLAY_OUT")
	if trace == "" || dir == "" {
		t.Skip("a measurement, not a check: set CPCACHE_REPLAY_TRACE and CPCACHE_REPLAY_OUT to run it")
	}
	inProcessTimeout = 2 * time.Hour
	n, _ := strconv.Atoi(os.Getenv("CPCACHE_REPLAY_REQUESTS"))
	plan := func(mutate func(*Config)) *Plan {
		cfg := DefaultConfig()
		cfg.Layout = parallel.LayoutConfig{World: 8, DP: 1, AttnCP: 8}
		cfg.Workload, cfg.TracePath, cfg.Requests = WorkloadTrace, trace, n
		cfg.PageSize, cfg.L1Pages, cfg.KVBytesPerToken = 64, 4096, 16
		mutate(&cfg)
		p, err := Prepare(cfg)
		require.NoError(t, err)
		return p
	}
	if v := os.Getenv("CPCACHE_REPLAY_STORAGE"); v != "" {
		l2, err := strconv.Atoi(v)
		require.NoError(t, err)
		for _, sync := range []bool{true, false} {
			rep := inProcessReport(t, plan(func(c *Config) {
				c.L2Pages, c.Storage, c.Time.PrefetchSync = l2, "mem://replay-"+strconv.FormatBool(sync), sync
			}))
			var b strings.Builder
			rep.WriteText(&b)
			t.Logf("prefetch-sync=%v\n%s", sync, b.String())
		}
		return
	}
	sw := &report.SweepResult{Param: "l2-pages", Values: []string{"1024", "4096", "16384"}}
	for _, v := range sw.Values {
		l2, _ := strconv.Atoi(v)
		rep := inProcessReport(t, plan(func(c *Config) { c.L2Pages = l2 }))
		sw.Reports = append(sw.Reports, rep)
		var b strings.Builder
		rep.WriteText(&b)
		t.Logf("l2-pages=%s\n%s", v, b.String())
	}
	var b strings.Builder
	report.WriteSweepTable(&b, sw)
	t.Logf("\n%s", b.String())
	for name, write := range map[string]func(*os.File) error{
		"sweep.json":  func(f *os.File) error { return report.WriteSweepJSON(f, sw) },
		"report.html": func(f *os.File) error { return report.WriteHTML(f, sw.Reports[len(sw.Reports)-1], sw) },
	} {
		f, err := os.Create(filepath.Join(dir, name))
		require.NoError(t, err)
		require.NoError(t, write(f))
		require.NoError(t, f.Close())
	}
}
