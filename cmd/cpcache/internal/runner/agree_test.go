package runner

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/workload"
)

// TestStartFlagsNameEveryDifference: a difference in any flag that shapes the scheduler or
// its workload is a bad input naming the flag and both values, on every rank of the job, at
// the first collective: ranks of one replica with different --max-running (or
// --batch-tokens, --clients, --rounds, --requests, ...) would make different decisions and
// wait for each other until the 60 s step deadline, then report a timeout naming no flag.
func TestStartFlagsNameEveryDifference(t *testing.T) {
	lc := parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}
	virtual := func(c *Config) { c.Time.Mode = TimeVirtual }
	cases := []struct {
		flag, want string
		mutate     func(*Config)
	}{
		{"--max-running", "16 on rank 0, 4 on rank 2", func(c *Config) { c.MaxRunning = 4 }},
		{"--batch-tokens", "8192 on rank 0, 512 on rank 2", func(c *Config) { c.BatchTokens = 512 }},
		{"--clients", "6 on rank 0, 5 on rank 2", func(c *Config) { c.Synthetic.Clients = 5 }},
		{"--rounds", "4 on rank 0, 3 on rank 2", func(c *Config) { c.Synthetic.Rounds = 3 }},
		{"--requests", "0 on rank 0, 7 on rank 2", func(c *Config) { c.Requests = 7 }},
		{"--policy", "write_through on rank 0, write_back on rank 2", func(c *Config) { c.Policy = hicache.WriteBack }},
		{"--l1-pages", "24 on rank 0, 128 on rank 2", func(c *Config) { c.L1Pages = 128 }},
		{"--time", "none on rank 0, virtual on rank 2", virtual},
		{"--strict", "false on rank 0, true on rank 2", func(c *Config) { c.Strict = true }},
		{"--consensus", `"" on rank 0, gloo on rank 2`, func(c *Config) { c.Consensus = "gloo" }},
		{"the workload's requests (synthetic)", "24 requests (digest ", func(c *Config) { c.Synthetic.QuestionTokens = 97 }},
		// Ranks with different isolation keys build different trees: they used to diverge,
		// recover 4 times and exit 1.
		{"--isolation", "none on rank 0, per-client on rank 2", func(c *Config) { c.Isolation = IsolationPerClient }},
		{"--turn-gap", "0s on rank 0, 2s on rank 2", func(c *Config) { c.Synthetic.TurnGapMs = 2000 }},
		{"--kv-events", `"" on rank 0, tcp://127.0.0.1:5557 on rank 2`, func(c *Config) { c.KVEvents = "tcp://127.0.0.1:5557" }},
		// A flag the runner does not name itself, compared as the command line gave it.
		{"--some-later-flag", "a on rank 0, b on rank 2", func(c *Config) { c.StartFlags = []StartFlag{{"--some-later-flag", "b"}} }},
	}
	base := smallPlan(t, lc, func(c *Config) { c.StartFlags = []StartFlag{{"--some-later-flag", "a"}} })
	for _, c := range cases {
		t.Run(c.flag, func(t *testing.T) {
			other := smallPlan(t, lc, func(cfg *Config) { cfg.StartFlags = base.Config.StartFlags; c.mutate(cfg) })
			errs := agreeOver(t, []*Plan{base, base, other, base})
			for r, err := range errs {
				require.ErrorIs(t, err, ErrBadInput, "rank %d", r)
				assert.Contains(t, err.Error(), c.flag+" differs between the ranks of the job: ", "rank %d", r)
				assert.Contains(t, err.Error(), c.want, "rank %d", r)
				assert.Equal(t, errs[0].Error(), err.Error(), "every rank gives the same verdict")
			}
		})
	}
	// --speed with virtual time, and the same flags with another trace's requests.
	fast := smallPlan(t, lc, func(c *Config) { virtual(c); c.Time.Speed = 10 })
	errs := agreeOver(t, []*Plan{smallPlan(t, lc, virtual), fast, fast, fast})
	require.ErrorIs(t, errs[3], ErrBadInput)
	assert.Contains(t, errs[3].Error(), "--speed differs between the ranks of the job: 1 on rank 0, 10 on rank 1")
	for r, err := range agreeOver(t, []*Plan{base, base, base, base}) {
		assert.NoError(t, err, "rank %d: the same flags agree", r)
	}
}

// TestStartFlagsTakeTheRunsValueOfAFlagItNames: a flag the runner compares as the run uses
// it is not compared again as the command line gave it (ranks under a launcher, one given
// --world 4 and one taking the launcher's 4, agree), and every other flag of
// Config.StartFlags is compared, before the digest of the requests.
func TestStartFlagsTakeTheRunsValueOfAFlagItNames(t *testing.T) {
	lc := parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}
	a := smallPlan(t, lc, func(c *Config) { c.StartFlags = []StartFlag{{"--world", "4"}, {"--x", "1"}} })
	b := smallPlan(t, lc, func(c *Config) { c.StartFlags = []StartFlag{{"--world", "16"}, {"--x", "1"}} })
	for r, err := range agreeOver(t, []*Plan{a, b, b, b}) {
		assert.NoError(t, err, "rank %d: --world is compared as the run uses it", r)
	}
	flags := a.startFlags()
	n := 0
	for i, f := range flags {
		if f.Flag == "--world" {
			n++
		}
		if f.Flag == "--x" {
			assert.Equal(t, "1", f.Value)
			assert.Equal(t, len(flags)-2, i, "the command line's other flags come before the requests' digest")
		}
	}
	assert.Equal(t, 1, n, "--world once")
	assert.True(t, strings.HasPrefix(flags[len(flags)-1].Flag, "the workload's requests"))
}

// TestStartFlagsCatchDifferentTraces: ranks that read different traces under the same
// flags (a file that differs between machines) are caught by the digest of the requests.
func TestStartFlagsCatchDifferentTraces(t *testing.T) {
	a := &Plan{Config: DefaultConfig(), Requests: []workload.Request{{ID: 0, Tokens: []int32{1, 2, 3}, OutputLen: 4}}}
	b := &Plan{Config: DefaultConfig(), Requests: []workload.Request{{ID: 0, Tokens: []int32{1, 2, 4}, OutputLen: 4}}}
	fa, fb := a.startFlags(), b.startFlags()
	for i := range fa {
		if fa[i] != fb[i] {
			assert.Equal(t, "the workload's requests (synthetic)", fa[i].Flag)
			assert.True(t, strings.HasPrefix(fa[i].Value, "1 requests (digest "), fa[i].Value)
			return
		}
	}
	t.Fatal("one token more or less is not told apart")
}

// agreeOver runs agreeStartFlags on a local group of len(plans) ranks, rank r with plans[r].
func agreeOver(t *testing.T, plans []*Plan) []error {
	t.Helper()
	n := len(plans)
	members := local.World(n, local.Options{Timeout: 10 * time.Second, Kind: "world"})
	errs := make([]error, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		grouptest.Parallel(n, func(r int) error {
			defer members[r].Close()
			errs[r] = agreeStartFlags(context.Background(), members[r], plans[r].startFlags())
			return nil
		})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the agreement did not end within 30 s")
	}
	return errs
}

func TestCompareStartFlagsRefusesAnotherVersion(t *testing.T) {
	err := compareStartFlags([]string{`[{"f":"--a","v":"1"}]`, `[{"f":"--a","v":"1"},{"f":"--b","v":"2"}]`}, []int{0, 1})
	require.True(t, errors.Is(err, ErrBadInput))
	assert.Contains(t, err.Error(), "different versions of cpcache")
}
