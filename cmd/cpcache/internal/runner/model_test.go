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

// TestSharedL2DeepSeek: --model deepseek-v3 (one replicated MLA latent) at attention-TP 4 ×
// CP 2: the TP ranks of a CP index share one slab, so the report's L2 bytes per page and the
// job's L2 bytes are 0.25× those of the same run with --separate-l2, L2 pages written are a
// quarter (only the TP-0 ranks write), and the runs serve the same hits with no bad page.
func TestSharedL2DeepSeek(t *testing.T) {
	lc := parallel.LayoutConfig{World: 8, AttnCP: 2}
	run := func(separate bool) *report.Report {
		p := smallPlan(t, lc, func(c *Config) {
			c.Model, c.KVBytesPerToken, c.SeparateL2 = "deepseek-v3", 0, separate
			c.PageSize, c.L1Pages, c.L2Pages = 4, 32, 64
			c.Synthetic.Clients, c.Synthetic.Rounds, c.Synthetic.SystemTokens, c.Synthetic.QuestionTokens, c.Synthetic.AnswerTokens = 4, 3, 16, 16, 4
		})
		require.Equal(t, 4, p.Layout.AttnTP)
		assert.Equal(t, !separate, p.SharesL2())
		return inProcessReport(t, p)
	}
	shared, separate := run(false), run(true)
	for _, rep := range []*report.Report{shared, separate} {
		assert.Zero(t, rep.BadPages)
		assert.Zero(t, rep.DigestMismatches)
		assert.Positive(t, rep.PagesVerified)
		assert.Positive(t, rep.TokensHitL2, "the workload loads pages back from L2")
	}
	page := int64(61 * 576 * 2 * 4) // DeepSeek-V3: 61 layers × 576 bf16 values per token, 4 tokens
	assert.Equal(t, report.L2Memory{Shared: true, Copies: 1, BytesPerPage: page, Slabs: 2, Bytes: 2 * 64 * page}, shared.L2)
	assert.Equal(t, report.L2Memory{Shared: false, Copies: 4, BytesPerPage: 4 * page, Slabs: 8, Bytes: 8 * 64 * page}, separate.L2)
	assert.Equal(t, 0.25, float64(shared.L2.BytesPerPage)/float64(separate.L2.BytesPerPage), "L2 bytes per page")
	assert.Equal(t, 0.25, float64(shared.L2.Bytes)/float64(separate.L2.Bytes), "the job's L2 bytes")
	assert.Equal(t, separate.TokensHitL2, shared.TokensHitL2, "the same decisions")
	assert.Equal(t, separate.PagesLoadedL2, shared.PagesLoadedL2, "every TP rank loads back into its own L1")
	assert.Positive(t, shared.PagesWrittenL2)
	assert.Equal(t, separate.PagesWrittenL2, 4*shared.PagesWrittenL2, "only the TP-0 ranks write the shared slab")
	var text bytes.Buffer
	shared.WriteText(&text)
	assert.Contains(t, text.String(), "L2 memory            281088 B per page (copies: 1), 35979264 B in all (slabs: 2, attention-TP ranks share a slab)")
	t.Logf("shared: %d B/page, %d B in all; separate: %d B/page, %d B in all", shared.L2.BytesPerPage, shared.L2.Bytes, separate.L2.BytesPerPage, separate.L2.Bytes)
}
