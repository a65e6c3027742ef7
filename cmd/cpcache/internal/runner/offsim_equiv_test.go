package runner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/workload"
)

func TestCacheOffSameAsOldSimulation(t *testing.T) {
	lc := parallel.LayoutConfig{World: 4, DP: 2, AttnCP: 2, DPAttention: true}
	for name, mutate := range map[string]func(*Config){
		"trace/virtual":        func(c *Config) {},
		"trace/none":           func(c *Config) { c.Time.Mode = TimeNone },
		"trace/virtual/run1":   func(c *Config) { c.MaxRunning = 1 },
		"trace/virtual/budget": func(c *Config) { c.BatchTokens = 600; c.L1Pages = 400 },
		"trace/virtual/speed":  func(c *Config) { c.Time.Speed = 0.01 },
		"trace/storage":        func(c *Config) { c.Storage = "mem://x" },
		"synthetic/none":       func(c *Config) { c.Workload, c.TracePath, c.Time.Mode = WorkloadSynthetic, "", TimeNone },
		"synthetic/turngap":    func(c *Config) { c.Workload, c.TracePath, c.Synthetic.TurnGapMs = WorkloadSynthetic, "", 40 },
		"synthetic/default-cost": func(c *Config) {
			c.Workload, c.TracePath = WorkloadSynthetic, ""
			c.Time.Cost, _ = LoadCostProfile(DefaultCostProfile, "")
			c.Synthetic.TurnGapMs = 5
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := attributionPlan(t, lc, func(c *Config) {
				c.Synthetic = workload.SyntheticConfig{Clients: 12, Rounds: 5, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 24, Seed: 3}
				mutate(c)
			})
			for dp := range p.Layout.AttnDP {
				reqs := p.ReplicaRequests(dp)
				old, cur := simulateNoCacheOld(&p.Config, reqs), simulateNoCache(&p.Config, reqs)
				require.NotEmpty(t, old.Timings())
				assert.Equal(t, old.Timings(), cur.Timings())
				assert.Equal(t, old.Computed(), cur.Computed())
				assert.Equal(t, old.MakespanNs(), cur.MakespanNs())
				assert.Equal(t, old.NowNs(), cur.NowNs())
			}
		})
	}
}

func TestCacheOffSameAsOldSimulationDemo(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"demo": func(c *Config) {
			c.Synthetic.Clients, c.Synthetic.Rounds, c.Synthetic.TurnGapMs = 64, 12, 4000
		},
		"trace400": func(c *Config) {
			c.Workload, c.TracePath, c.L1Pages, c.L2Pages = WorkloadTrace, "../../../../testdata/conversation_trace_400.jsonl", 16384, 32768
		},
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		p, err := Prepare(cfg)
		require.NoError(t, err, name)
		for dp := range p.Layout.AttnDP {
			reqs := p.ReplicaRequests(dp)
			t.Logf("%s: replica %d: %d requests", name, dp, len(reqs))
			if len(reqs) == 0 {
				continue
			}
			old, cur := simulateNoCacheOld(&p.Config, reqs), simulateNoCache(&p.Config, reqs)
			require.NotEmpty(t, old.Timings())
			assert.Equal(t, old.Timings(), cur.Timings(), name)
			assert.Equal(t, old.MakespanNs(), cur.MakespanNs(), name)
			assert.Equal(t, old.Computed(), cur.Computed(), name)
		}
	}
}
