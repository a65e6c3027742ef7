package runner

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/refmodel"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/workload"
)

// enginePlan is a small --engine model run at CP 4 (host memory): three conversations of
// three turns (histories of up to 31 pages of 4 tokens) over 10 L1 page slots per rank, so
// later turns come back from L2 as well as from L1.
func enginePlan(t *testing.T, variant string, mutate func(*Config)) *Plan {
	return smallPlan(t, parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}, func(c *Config) {
		c.Engine, c.ModelVariant, c.KVBytesPerToken = EngineModel, variant, 0
		c.Synthetic = workload.SyntheticConfig{Clients: 3, Rounds: 3, SystemTokens: 16, QuestionTokens: 32, AnswerTokens: 4, Seed: 5}
		c.PageSize, c.L1Pages, c.L2Pages = 4, 10, 64
		if mutate != nil {
			mutate(c)
		}
	})
}

// TestEngineModel: the reference model does the compute on every rank at CP 4 (its own
// pages' attention, merged over the attention-CP group), for the GQA default and the MLA
// variant: every request's output equals the cache-off reference's (outputs checked = the
// requests, differing 0), with hits from L1 and from L2 (load-backs waited layer by layer),
// one consensus collective per step and no bad page; every later turn hits its history
// beyond the previous prompt, so its prompt holds the previous turn's generated answer
// (the cache holds no placeholder answer). The report's text and JSON say so.
func TestEngineModel(t *testing.T) {
	for _, variant := range []string{"gqa", "mla"} {
		t.Run(variant, func(t *testing.T) {
			p := enginePlan(t, variant, nil)
			m, err := p.Config.refModel()
			require.NoError(t, err)
			require.True(t, p.KVLayout.Equal(m.Layout()), "the run's KV layout is the model's")
			assert.Equal(t, m.Layout().String(), p.Config.Model)
			var mu sync.Mutex
			hits := map[int]int64{} // rank 0's hit tokens by request ID
			out := runInProcessWith(t, p, inProcessOptions{corruptRank: -1, onPrefilled: func(rank int, r workload.Request, hit int64) {
				if rank == 0 {
					mu.Lock()
					hits[r.ID] = hit
					mu.Unlock()
				}
			}})
			var waits int64
			for rank, o := range out {
				require.NoError(t, o.err, "rank %d", rank)
				require.NoError(t, o.firstBad, "rank %d", rank)
				assert.Equal(t, out[0].counts, o.counts, "rank %d counts what rank 0 counts", rank)
				assert.Equal(t, int(o.counts.Steps), o.collectives, "rank %d: one consensus collective per step", rank)
				assert.Zero(t, o.local.BadPages, "rank %d", rank)
				assert.Zero(t, o.local.LayerWaits%int64(p.KVLayout.NumLayers), "rank %d: every load-back waits for every layer", rank)
				waits += o.local.LayerWaits
				require.NotNil(t, o.model, "rank %d", rank)
				assert.Positive(t, o.model.Tokens, "rank %d", rank)
				assert.Positive(t, o.model.RefTokens, "rank %d", rank)
			}
			c := out[0].counts
			assert.Equal(t, int64(len(p.Requests)), c.OutputsChecked, "every request's output is checked")
			assert.Zero(t, c.OutputsDiffering)
			assert.Positive(t, c.HitL1, "prefixes served from L1")
			assert.Positive(t, c.HitL2, "prefixes loaded back from L2")
			assert.Positive(t, waits, "load-backs waited layer by layer")
			for _, r := range p.Requests {
				if r.Round == 0 {
					continue
				}
				history := len(r.Tokens) - p.Config.Synthetic.QuestionTokens // the previous prompt and its answer
				prev := history - p.Config.Synthetic.AnswerTokens
				assert.Greater(t, hits[r.ID], int64(prev), "request %d (turn %d) hits the previous turn's generated answer", r.ID, r.Round)
			}
			assert.Less(t, out[0].model.Tokens, out[0].model.RefTokens, "the cache saves compute")

			rep := inProcessReport(t, p)
			require.NotNil(t, rep.Model)
			assert.Equal(t, int64(len(p.Requests)), rep.Model.OutputsChecked)
			assert.Equal(t, 1.0, rep.CollectivesPerStep)
			var text bytes.Buffer
			rep.WriteText(&text)
			assert.Contains(t, text.String(), fmt.Sprintf("  reference model      %s: outputs checked %d, differing 0\n", variant, len(p.Requests)))
			assert.Contains(t, text.String(), "  model compute        ")
			js, err := json.Marshal(rep)
			require.NoError(t, err)
			assert.Contains(t, string(js), fmt.Sprintf(`"outputs_checked":%d,"outputs_differing":0`, len(p.Requests)))
		})
	}
}

// TestEngineModelCatchesABrokenDataPath: the output check fails when the data path is broken
// on purpose: a loaded L1 page's layer-0 K values damaged on one rank once the load landed
// (after the layer-wise wait, before the model reads it), or one rank's L2 pages of a node
// damaged before their load-back. Every rank counts the differing outputs (the CP merge gives
// every rank the damaged result) and names the first.
func TestEngineModelCatchesABrokenDataPath(t *testing.T) {
	damageOnce := func() func(*kvmem.L1, []int32) {
		done := false
		return func(l1 *kvmem.L1, slots []int32) {
			if done {
				return
			}
			done = true
			b, err := l1.HostChunk(slots[0], 0, 0)
			require.NoError(t, err)
			for i := 0; i+4 <= len(b); i += 4 { // flip an exponent bit of every float32
				binary.LittleEndian.PutUint32(b[i:], binary.LittleEndian.Uint32(b[i:])^0x40000000)
			}
		}
	}
	cases := map[string]inProcessOptions{
		"damaged L1 page": {corruptRank: -1, damageL1: func(rank int) func(*kvmem.L1, []int32) {
			if rank != 1 {
				return nil
			}
			return damageOnce()
		}},
		"damaged L2 pages": {corruptRank: 0, corruptNode: true},
	}
	for name, opts := range cases {
		t.Run(name, func(t *testing.T) {
			p := enginePlan(t, "gqa", nil)
			out := runInProcessWith(t, p, opts)
			for rank, o := range out {
				require.NoError(t, o.err, "rank %d: a differing output does not stop the run", rank)
				assert.Positive(t, o.counts.OutputsDiffering, "rank %d", rank)
				assert.Equal(t, out[0].counts, o.counts, "rank %d", rank)
				require.ErrorIs(t, o.firstBad, sched.ErrOutputDiffers, "rank %d", rank)
				assert.Contains(t, o.firstBad.Error(), "without the cache")
			}
			t.Logf("outputs checked %d, differing %d; %v", out[0].counts.OutputsChecked, out[0].counts.OutputsDiffering, out[0].firstBad)
		})
	}
}

// TestEngineFlags: --engine and --model-variant take their values or are bad input naming
// them; --engine model sets --model to the model's layout (an equal --model is accepted),
// and needs attention-TP 1 and a host run.
func TestEngineFlags(t *testing.T) {
	lc := parallel.LayoutConfig{World: 2, DP: 1, AttnCP: 2, DPAttention: true}
	plain := smallPlan(t, lc, nil)
	assert.Equal(t, EngineKVTest, plain.Config.Engine)
	for v, variant := range modelVariants {
		p := smallPlan(t, lc, func(c *Config) { c.Engine, c.ModelVariant, c.KVBytesPerToken = EngineModel, v, 0 })
		m, err := refmodel.New(refmodel.DefaultConfig(variant))
		require.NoError(t, err)
		assert.True(t, p.KVLayout.Equal(m.Layout()), v)
		assert.True(t, p.Config.layered(), "%s: per-layer L1 buffers", v)
		same := smallPlan(t, lc, func(c *Config) {
			c.Engine, c.ModelVariant, c.Model, c.KVBytesPerToken = EngineModel, v, m.Layout().String(), 0
		})
		assert.Equal(t, p.Config.Model, same.Config.Model)
	}
	def := smallPlan(t, lc, func(c *Config) { c.Engine, c.KVBytesPerToken = EngineModel, 0 })
	assert.Equal(t, "gqa", def.Config.ModelVariant)
	cases := map[string]func(*Config){
		`--engine "torch" (want kvtest or model)`:                                    func(c *Config) { c.Engine = "torch" },
		"--model-variant mla needs --engine model":                                   func(c *Config) { c.ModelVariant = "mla" },
		`--model-variant "moe" (want gqa, mla or side)`:                              func(c *Config) { c.Engine, c.ModelVariant = EngineModel, "moe" },
		"--model llama-3-8b: --engine model runs on the reference model's KV layout": func(c *Config) { c.Engine, c.Model = EngineModel, "llama-3-8b" },
		"--engine model needs attention-TP 1": func(c *Config) {
			c.Engine, c.Layout = EngineModel, parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 2, DPAttention: true}
		},
		"--engine model needs --device host": func(c *Config) { c.Engine, c.Device = EngineModel, DeviceCUDA },
	}
	for want, mutate := range cases {
		cfg := DefaultConfig()
		cfg.Layout, cfg.KVBytesPerToken = lc, 0
		mutate(&cfg)
		_, err := Prepare(cfg)
		require.ErrorIs(t, err, ErrBadInput, want)
		assert.Contains(t, err.Error(), want)
	}
}
