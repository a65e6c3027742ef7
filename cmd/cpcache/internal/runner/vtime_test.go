package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

func TestCostProfilesLoadAndOverride(t *testing.T) {
	for _, name := range CostProfiles() {
		p, err := LoadCostProfile(name, "")
		require.NoError(t, err, name)
		assert.NotEmpty(t, p.Source, "profile %s names its source", name)
	}
	p, err := LoadCostProfile("", "prefill_ns_per_token=3000, h2d_gbps=25,kv_bytes_per_token=4096")
	require.NoError(t, err)
	assert.Equal(t, 3000.0, p.PrefillNsPerToken)
	assert.Equal(t, 25.0, p.H2DGBps)
	assert.Equal(t, 4096, p.KVBytesPerToken)
	assert.Contains(t, p.Name, DefaultCostProfile)

	path := filepath.Join(t.TempDir(), "profile.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"name": "mine", "prefill_ns_per_token": 2, "h2d_gbps": 1, "d2h_gbps": 1, "storage_gbps": 1}`), 0o600))
	p, err = LoadCostProfile(path, "")
	require.NoError(t, err)
	assert.Equal(t, "mine", p.Name)
	assert.Equal(t, 2.0, p.PrefillNsPerToken)

	bad := map[string][2]string{
		"neither a built-in profile":    {"no-such-profile", ""},
		"want field=value":              {"unit", "prefill=3"},
		`value "x" is not a number`:     {"unit", "decode_step_ns=x"},
		"not a whole number":            {"unit", "kv_bytes_per_token=1.5"},
		"h2d_gbps 0 must be positive":   {"unit", "h2d_gbps=0"},
		"decode_step_ns -1 is negative": {"unit", "decode_step_ns=-1"},
		// Not finite: accepted, they ran the whole job and then failed writing the report.
		"prefill_ns_per_token NaN is not a finite number": {"unit", "prefill_ns_per_token=NaN"},
		"h2d_gbps +Inf is not a finite number":            {"unit", "h2d_gbps=Inf"},
		"decode_step_ns -Inf is not a finite number":      {"unit", "decode_step_ns=-Inf"},
		"kv_bytes_per_token 1099511627776 is over":        {"unit", "kv_bytes_per_token=1099511627776"},
		`"1e30" is not a whole number`:                    {"unit", "kv_bytes_per_token=1e30"},
	}
	for want, in := range bad {
		_, err := LoadCostProfile(in[0], in[1])
		require.ErrorIs(t, err, ErrBadInput, want)
		assert.Contains(t, err.Error(), want)
	}
	require.NoError(t, os.WriteFile(path, []byte(`{"prefill_ns_per_tokens": 2}`), 0o600))
	_, err = LoadCostProfile(path, "")
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "prefill_ns_per_tokens", "an unknown field is named")
}

func TestParseSweep(t *testing.T) {
	param, values, err := ParseSweep("l2-pages=1024, 4096,16384")
	require.NoError(t, err)
	assert.Equal(t, "l2-pages", param)
	assert.Equal(t, []string{"1024", "4096", "16384"}, values)
	for _, in := range []string{"l2-pages", "page-size=1,2", "l1-pages=1,,2"} {
		_, _, err := ParseSweep(in)
		require.ErrorIs(t, err, ErrBadInput, in)
		assert.Contains(t, err.Error(), in)
	}
}

func TestPrepareRejectsBadTime(t *testing.T) {
	for want, mutate := range map[string]func(*Config){
		`time "wall"`:                        func(c *Config) { c.Time.Mode = "wall" },
		"speed -2 must be a positive number": func(c *Config) { c.Time.Speed = -2 },
		"--turn-gap 2s needs --time virtual": func(c *Config) { c.Time.Mode, c.Synthetic.TurnGapMs = TimeNone, 2000 },
		"--turn-gap 2s is for --workload synthetic": func(c *Config) {
			c.Workload, c.TracePath, c.Synthetic.TurnGapMs = WorkloadTrace, "x.jsonl", 2000
		},
		"turn gap 3600001 ms is outside": func(c *Config) { c.Synthetic.TurnGapMs = workload.MaxTurnGapMs + 1 },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		_, err := Prepare(cfg)
		require.ErrorIs(t, err, ErrBadInput, want)
		assert.Contains(t, err.Error(), want)
	}
}

// TestTurnGapImpliesVirtualTime: a synthetic workload with a turn gap is served in virtual
// time unless told otherwise (the gap means nothing under --time none), and its arrivals are
// the gap's.
func TestTurnGapImpliesVirtualTime(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Synthetic.Clients, cfg.Synthetic.Rounds, cfg.Synthetic.TurnGapMs = 4, 2, 1000
	p, err := Prepare(cfg)
	require.NoError(t, err)
	assert.Equal(t, TimeVirtual, p.Config.Time.Mode)
	assert.Equal(t, int64(1250), p.Requests[5].ArrivalMs, "client 1's second turn: one gap and a quarter")
	assert.Contains(t, p.Desc, "a turn every 1s per conversation")
	cfg.Synthetic.TurnGapMs = 0
	p, err = Prepare(cfg)
	require.NoError(t, err)
	assert.Equal(t, TimeNone, p.Config.Time.Mode, "without a gap a synthetic workload is served back to back")
}

func TestVirtualTimeReplaysArrivals(t *testing.T) {
	// The unit profile: 1 µs per computed token, 1 ms + 10 µs per request per decode step.
	lc := parallel.LayoutConfig{World: 2, AttnCP: 2}
	run := func(mode string, speed float64) (*Plan, []vtime.RequestTiming, float64) {
		p := attributionPlan(t, lc, func(c *Config) { c.Time.Mode, c.Time.Speed = mode, speed })
		out := runInProcess(t, p, -1)
		requireAgreed(t, p, out)
		return p, out[0].timing.Requests, out[0].timing.MakespanNs
	}
	p, virtual, span := run(TimeVirtual, 1)
	require.Len(t, virtual, len(p.Requests))
	last := p.Requests[len(p.Requests)-1].ArrivalMs
	assert.GreaterOrEqual(t, span, float64(last)*1e6, "the replay lasts at least until the last arrival")
	byArrival := map[int64]bool{}
	for _, r := range p.Requests {
		byArrival[r.ArrivalMs*1e6] = true
	}
	for _, tm := range virtual {
		assert.True(t, byArrival[tm.ArrivalNs], "arrival %d ns is a trace timestamp", tm.ArrivalNs)
		assert.GreaterOrEqual(t, tm.QueueNs, int64(0), "nothing is admitted before it arrives")
		computed := int64(tm.Prompt - tm.HitL1 - tm.HitL2 - tm.HitL3)
		assert.GreaterOrEqual(t, tm.TTFTNs, tm.QueueNs+computed*1000, "the first token comes after its prefill")
	}
	_, fast, fastSpan := run(TimeVirtual, 1000)
	assert.Less(t, fastSpan, span, "--speed 1000 compresses the arrivals")
	assert.Equal(t, int64(3e6/1000), fast[1].ArrivalNs-fast[0].ArrivalNs, "arrivals 3 ms apart become 3 µs apart")

	_, none, _ := run(TimeNone, 1)
	for _, tm := range none {
		assert.Zero(t, tm.ArrivalNs, "--time none: every request arrived at 0")
	}
}

func TestCacheOffSimulationComputesEveryToken(t *testing.T) {
	p := attributionPlan(t, parallel.LayoutConfig{World: 2, AttnCP: 2}, func(c *Config) {})
	off := simulateNoCache(&p.Config, p.Requests)
	var prompt int64
	for _, r := range p.Requests {
		prompt += int64(len(r.Tokens))
	}
	assert.Equal(t, prompt, off.Computed())
	require.Len(t, off.Timings(), len(p.Requests))
	out := runInProcess(t, p, -1)
	on := out[0].timing
	assert.Less(t, on.ComputedTokens, off.Computed(), "the cache saves prefill tokens")
	onFig, offFig := report.Figures([]report.ReplicaTiming{*on}, 0), report.Figures([]report.ReplicaTiming{report.TimingOf(off)}, 0)
	assert.LessOrEqual(t, onFig.TTFTP50Ms, offFig.TTFTP50Ms, "hits shorten the prefill")
	assert.Len(t, onFig.TTFTQuantilesMs, 101)
}

// TestVirtualTimeDoesNotFollowTheHostsCopySpeed: an insert or load-back that finds L1 full
// must not give up and retry at later steps until the group agrees that the copies freeing
// L1 are over: that takes as many steps as the host's copies take wall time, each charged a
// decode step, and which pages are evicted meanwhile follows it too. A trace of requests
// sharing no prefix (nothing can hit) would then have TTFTs above the cache-off simulation
// of the same rules and costs, and two runs of one job would report different TTFTs and
// hits per tier.
func TestVirtualTimeDoesNotFollowTheHostsCopySpeed(t *testing.T) {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%d, %d, %d, %d]}`+"\n",
			5*i, 1500+11*i, 20+i, 4*i, 4*i+1, 4*i+2, 4*i+3)
	}
	trace := filepath.Join(t.TempDir(), "distinct.jsonl")
	require.NoError(t, os.WriteFile(trace, []byte(b.String()), 0o600))
	for _, policy := range []hicache.Policy{hicache.WriteThrough, hicache.WriteBack} {
		t.Run(policy.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Layout = parallel.LayoutConfig{World: 2, AttnCP: 2}
			cfg.Workload, cfg.TracePath, cfg.Policy = WorkloadTrace, trace, policy
			// L1 holds about three requests: every admission evicts what earlier ones left.
			cfg.PageSize, cfg.L1Pages, cfg.L2Pages, cfg.KVBytesPerToken = 16, 400, 4000, 8
			cfg.Time.Cost, _ = LoadCostProfile("unit", "")
			p, err := Prepare(cfg)
			require.NoError(t, err)
			off := simulateNoCache(&p.Config, p.Requests).Timings()
			var first sched.Counts
			for run := range 2 {
				out := runInProcess(t, p, -1)
				requireAgreed(t, p, out)
				c := out[0].counts
				assert.Zero(t, c.HitL1+c.HitL2, "run %d: no request shares a prefix", run)
				assert.Zero(t, c.Retries, "run %d: with no copy in flight L1 has room for every request", run)
				on := out[0].timing.Requests
				require.Len(t, on, len(off))
				for i := range on {
					assert.Equal(t, off[i].TTFTNs, on[i].TTFTNs, "run %d, request %d: nothing hits, so its TTFT is the cache-off one", run, i)
				}
				// Only the number of steps spent waiting for copies follows the host.
				c.Steps, c.LoadSteps, c.SettleSteps = 0, 0, 0
				if run == 0 {
					first = c
				} else {
					assert.Equal(t, first, c, "two runs of one job count alike")
				}
			}
		})
	}
}
