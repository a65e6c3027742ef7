package runner

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
)

// TestPrepareModel: --model sets KVBytesPerToken to one rank's bytes per token of the
// layout at the plan's attention-TP size (the layout's own figure), keeps an explicit
// --kv-bytes-per-token of the same value, and refuses another value or an unknown preset,
// naming them.
func TestPrepareModel(t *testing.T) {
	llama, err := kvlayout.Preset("llama-3-8b")
	require.NoError(t, err)
	for _, lc := range []parallel.LayoutConfig{
		{World: 2, DP: 1, AttnCP: 2, DPAttention: true}, // attention-TP 1
		{World: 4, DP: 1, AttnCP: 2, DPAttention: true}, // attention-TP 2
	} {
		p := smallPlan(t, lc, func(c *Config) { c.Model, c.KVBytesPerToken = "llama-3-8b", 0 })
		want, err := llama.BytesPerToken(p.Layout.AttnTP)
		require.NoError(t, err)
		assert.Equal(t, int(want), p.Config.KVBytesPerToken, "attention-TP %d", p.Layout.AttnTP)
		require.NotNil(t, p.KVLayout)
		assert.True(t, p.KVLayout.Equal(llama))
		if p.Layout.AttnTP == 1 {
			assert.Equal(t, 32*2*2048, p.Config.KVBytesPerToken, "32 layers × K and V × 2048 bytes")
		}
		same := smallPlan(t, lc, func(c *Config) { c.Model, c.KVBytesPerToken = "llama-3-8b", int(want) })
		assert.Equal(t, p.Config.KVBytesPerToken, same.Config.KVBytesPerToken)
		rep := p.kvLayoutReport()
		require.NotNil(t, rep)
		assert.Equal(t, report.KVLayout{Name: "llama-3-8b", Spec: llama.String(), BytesPerToken: want, PageBytes: want * int64(p.Config.PageSize)}, *rep)
	}
	lc := parallel.LayoutConfig{World: 2, DP: 1, AttnCP: 2, DPAttention: true}
	spec := smallPlan(t, lc, func(c *Config) { c.Model, c.KVBytesPerToken = "layers=2;kv=576:replicated", 0 })
	assert.Equal(t, 2*576, spec.Config.KVBytesPerToken)
	assert.Equal(t, 2, spec.Config.Time.Model.Layers, "the virtual clock overlaps load-backs over the layout's layers")
	assert.Nil(t, smallPlan(t, lc, nil).KVLayout, "no --model, no layout")
	assert.Zero(t, smallPlan(t, lc, nil).Config.Time.Model.Layers, "no --model: opaque pages load whole")
	assert.Nil(t, smallPlan(t, lc, nil).kvLayoutReport())

	cases := map[string]func(*Config){
		`--model llama-9: kvlayout: unknown preset "llama-9" (known: deepseek-v3, llama-3-70b`:                  func(c *Config) { c.Model = "llama-9" },
		"--model llama-3-8b holds 131072 bytes per token per rank at attention-TP 1, --kv-bytes-per-token is 8": func(c *Config) { c.Model = "llama-3-8b" },
		`--model layers=2;k=x:sharded: kvlayout: token 1 "k=x:sharded"`:                                         func(c *Config) { c.Model = "layers=2;k=x:sharded" },
	}
	for want, mutate := range cases {
		cfg := DefaultConfig()
		cfg.Layout = lc
		cfg.KVBytesPerToken = 8
		mutate(&cfg)
		_, err := Prepare(cfg)
		require.ErrorIs(t, err, ErrBadInput, want)
		if c := cfg.Model; c != "llama-3-8b" {
			assert.ErrorIs(t, err, kvlayout.ErrBadLayout, want)
		}
		assert.Contains(t, err.Error(), want)
	}
	// A sharded part attention-TP does not divide.
	cfg := DefaultConfig()
	cfg.Layout, cfg.Model, cfg.KVBytesPerToken = parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 2, DPAttention: true}, "layers=1;k=3:sharded", 0
	_, err = Prepare(cfg)
	require.ErrorIs(t, err, ErrBadInput)
	assert.ErrorIs(t, err, kvlayout.ErrBadLayout)
	assert.Contains(t, err.Error(), "--model layers=1;k=3:sharded at attention-TP 2")
}

// TestAgreeModel: ranks given different --model values with the same bytes per token are
// told apart by the start flags, naming --model.
func TestAgreeModel(t *testing.T) {
	lc := parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}
	a := smallPlan(t, lc, func(c *Config) { c.Model = "layers=1;k=4:sharded;v=4:sharded" })
	b := smallPlan(t, lc, func(c *Config) { c.Model = "layers=2;k=2:sharded;v=2:sharded" })
	require.Equal(t, a.Config.KVBytesPerToken, b.Config.KVBytesPerToken)
	errs := agreeOver(t, []*Plan{a, a, a, b})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrBadInput, "rank %d", r)
		assert.Contains(t, err.Error(), "--model differs between the ranks of the job: layers=1;k=4:sharded;v=4:sharded on rank 0, layers=2;k=2:sharded;v=2:sharded on rank 3")
	}
	for r, err := range agreeOver(t, []*Plan{a, a, a, a}) {
		assert.NoError(t, err, "rank %d", r)
	}
	// The report's text line.
	rep := report.Report{KVLayout: a.kvLayoutReport()}
	var buf bytes.Buffer
	rep.WriteText(&buf)
	assert.Contains(t, buf.String(), "  kv layout            layers=1;k=4:sharded;v=4:sharded (8 B/token per rank, 64 B/page)\n")
}
