package runner

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
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
		assert.Equal(t, report.KVLayout{Name: "llama-3-8b", Spec: llama.String(), BytesPerToken: want, PageBytes: want * int64(p.Config.PageSize),
			Layers: 32, Parts: 2, L2Layout: L2PageFirst, L1: "host, per layer and part a token-slot buffer"}, *rep)
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

// modelPlan is a small run of --model model on CP 2 (attention-TP 1): three conversations of
// three turns whose histories (about 16 pages of 8 tokens each) overflow 24 L1 pages, so
// turns come back from L2.
func modelPlan(t *testing.T, model, l2Layout, l1Buffers string) *Plan {
	return smallPlan(t, parallel.LayoutConfig{World: 2, DP: 1, AttnCP: 2, DPAttention: true}, func(c *Config) {
		c.Model, c.KVBytesPerToken, c.L2Layout, c.L1Buffers = model, 0, l2Layout, l1Buffers
		c.Synthetic = workload.SyntheticConfig{Clients: 3, Rounds: 3, SystemTokens: 16, QuestionTokens: 32, AnswerTokens: 4, Seed: 5}
		c.L1Pages, c.L2Pages = 24, 64
	})
}

// TestRunModelLayered: --model llama-3-8b and deepseek-v3 on a host run, both L2 layouts (and
// vLLM's block-major L1 once): the ranks lend per-layer L1 buffers, fill every chunk of every
// page they own with the layered content, wait for each load-back layer by layer (checking each
// layer's chunks as it lands), and end with every loaded page verified, none bad, and one
// consensus collective per step; the report states the layout, the L1 and the L2 layout.
func TestRunModelLayered(t *testing.T) {
	cases := []struct{ model, l2, l1 string }{
		{"llama-3-8b", L2PageFirst, ""},
		{"llama-3-8b", L2LayerFirst, ""},
		{"llama-3-8b", L2LayerFirst, L1BlockMajor},
		{"deepseek-v3", L2PageFirst, ""},
		{"deepseek-v3", L2LayerFirst, ""},
	}
	for _, tc := range cases {
		t.Run(tc.model+"/"+tc.l2+"/"+tc.l1, func(t *testing.T) {
			p := modelPlan(t, tc.model, tc.l2, tc.l1)
			out := runInProcess(t, p, -1)
			requireAgreed(t, p, out)
			var loaded, waits, filled int64
			for rank, o := range out {
				loaded += o.loaded
				waits += o.local.LayerWaits
				filled += o.local.PagesFilled
				assert.Zero(t, o.local.LayerWaits%int64(p.KVLayout.NumLayers), "rank %d: every load-back waits for every layer", rank)
			}
			assert.Positive(t, loaded, "pages came back from L2")
			assert.Positive(t, waits, "load-backs waited layer by layer")
			assert.Positive(t, filled)
			rep := report.Report{KVLayout: p.kvLayoutReport()}
			rep.KVLayout.LayerWaits = waits
			var buf bytes.Buffer
			rep.WriteText(&buf)
			kv := p.KVLayout
			l1 := "host, per layer and part a token-slot buffer"
			if tc.l1 == L1BlockMajor {
				l1 = "host, per layer a block-major tensor"
			}
			assert.Contains(t, buf.String(), fmt.Sprintf("  kv layout            %s (%d B/token per rank, %d B/page)\n", tc.model, p.Config.KVBytesPerToken, p.Config.PageBytes()))
			assert.Contains(t, buf.String(), fmt.Sprintf("  kv memory            L1 %s; L2 %s; %d layers × %d parts = %d chunks of a page\n", l1, tc.l2, kv.NumLayers, len(kv.Parts), kv.NumLayers*len(kv.Parts)))
			assert.Contains(t, buf.String(), fmt.Sprintf("  layer-wise waits     %d (", waits))
		})
	}
}

// TestKVMemoryFlags: --l2-layout and --l1-buffers take their values or are bad input naming
// the value; layer_first and --l1-buffers need --model, block_major a host run; the defaults are
// page_first, and with --model token-slot buffers; a run without --model keeps the flat pool
// of opaque pages (no per-layer L1, no layer waits).
func TestKVMemoryFlags(t *testing.T) {
	lc := parallel.LayoutConfig{World: 2, DP: 1, AttnCP: 2, DPAttention: true}
	plain := smallPlan(t, lc, nil)
	assert.Equal(t, L2PageFirst, plain.Config.L2Layout)
	assert.False(t, plain.Config.layered(), "no --model: opaque pages in one pool")
	m := smallPlan(t, lc, func(c *Config) { c.Model, c.KVBytesPerToken = "llama-3-8b", 0 })
	assert.Equal(t, L1TokenSlot, m.Config.L1Buffers)
	cases := map[string]func(*Config){
		`--l2-layout "layer-first" (want page_first or layer_first)`: func(c *Config) { c.L2Layout = "layer-first" },
		`--l1-buffers "paged" (want token_slot or block_major)`:      func(c *Config) { c.L1Buffers = "paged" },
		"--l2-layout layer_first needs --model":                      func(c *Config) { c.L2Layout = L2LayerFirst },
		"--l1-buffers block_major needs --model":                     func(c *Config) { c.L1Buffers = L1BlockMajor },
		"--l1-buffers block_major needs --device host (a CUDA run's per-layer L1 is token-slot buffers)": func(c *Config) {
			c.Model, c.KVBytesPerToken, c.L1Buffers, c.Device = "llama-3-8b", 0, L1BlockMajor, DeviceCUDA
		},
	}
	for want, mutate := range cases {
		cfg := DefaultConfig()
		cfg.Layout = lc
		mutate(&cfg)
		_, err := Prepare(cfg)
		require.ErrorIs(t, err, ErrBadInput, want)
		assert.Contains(t, err.Error(), want)
	}
	// Ranks that differ in the L2 layout are told apart by the start flags.
	a := smallPlan(t, lc, func(c *Config) { c.Model, c.KVBytesPerToken = "llama-3-8b", 0 })
	b := smallPlan(t, lc, func(c *Config) { c.Model, c.KVBytesPerToken, c.L2Layout = "llama-3-8b", 0, L2LayerFirst })
	for r, err := range agreeOver(t, []*Plan{a, b}) {
		require.ErrorIs(t, err, ErrBadInput, "rank %d", r)
		assert.Contains(t, err.Error(), "--l2-layout differs between the ranks of the job: page_first on rank 0, layer_first on rank 1")
	}
}

// TestCorruptLayeredL2PageIsNamed: a byte of layer 0 of the L2 pages rank 0 owns of a node,
// damaged before the node's load, is found by the layer-wise check, in either L2 layout,
// naming the layer and part; rank 1 loads only its own pages and finds none.
func TestCorruptLayeredL2PageIsNamed(t *testing.T) {
	for _, lay := range []string{L2PageFirst, L2LayerFirst} {
		p := modelPlan(t, "llama-3-8b", lay, "")
		out := runInProcessWith(t, p, inProcessOptions{corruptRank: 0, corruptNode: true})
		require.NoError(t, out[0].err, "%s: a bad page does not stop the run", lay)
		require.Error(t, out[0].firstBad, lay)
		assert.Regexp(t, `request \d+: page \d+ loaded from L2 is wrong: kvtest: page \d+ .*: layer 0 part 0 \("k"\)`, out[0].firstBad.Error(), lay)
		assert.Positive(t, out[0].local.BadPages, lay)
		assert.NoError(t, out[1].firstBad, "%s: rank 1 loads only its own pages", lay)
	}
}
