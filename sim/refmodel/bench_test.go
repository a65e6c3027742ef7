package refmodel_test

import (
	"context"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/sim/refmodel"
)

// The reference model's own speed: a 64-token prefill and 16 greedy decodes on one rank.
func BenchmarkReferenceGenerate(b *testing.B) {
	for _, v := range []refmodel.Variant{refmodel.GQA, refmodel.MLA, refmodel.Side} {
		b.Run(v.String(), func(b *testing.B) {
			m, err := refmodel.New(refmodel.DefaultConfig(v))
			if err != nil {
				b.Fatal(err)
			}
			prompt := make([]int32, 64)
			for i := range prompt {
				prompt[i] = int32(i * 7 % 512)
			}
			b.ResetTimer()
			for range b.N {
				if _, _, err := m.Generate(context.Background(), refmodel.Pass{KV: refmodel.NewMemKV(m), PageTokens: pageTokens}, prompt, 0, 16); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*(64+15))/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// The oracle's workload at CP 2 with L2 hits: the model's tokens/s beside the share of the
// serving time spent outside the model (the cache's calls: match, load-back, steps, insert,
// KV copies into L1, backups).
func BenchmarkOracleServe(b *testing.B) {
	m, err := refmodel.New(refmodel.DefaultConfig(refmodel.GQA))
	if err != nil {
		b.Fatal(err)
	}
	var sum stats
	for range b.N {
		_, st := cacheOn(b, m, 5, oracleConfig{variant: refmodel.GQA, cp: 2, evict: true, l2Layout: kvmem.PageFirst})
		sum.computed += st.computed
		sum.model += st.model
		sum.total += st.total
	}
	b.ReportMetric(float64(sum.computed)/sum.model.Seconds(), "model-tokens/s")
	b.ReportMetric((sum.total-sum.model).Seconds()/sum.total.Seconds(), "cache-share")
}
