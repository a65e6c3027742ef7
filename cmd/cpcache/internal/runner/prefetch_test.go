package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/workload"
)

// conversationTrace is the Mooncake conversation trace beside the project (tests skip
// without it).
var conversationTrace = filepath.Join("..", "..", "..", "..", "..", "shared", "data", "traces", "conversation_trace.jsonl")

// shortTrace writes the first n lines of the conversation trace whose prompts are at most
// maxInput tokens to a file of the test's, or skips the test without the trace.
func shortTrace(t *testing.T, n, maxInput int) string {
	t.Helper()
	b, err := os.ReadFile(conversationTrace)
	if err != nil {
		t.Skipf("the conversation trace is not here: %v", err)
	}
	var out []byte
	for line := range bytes.Lines(b) {
		var r struct {
			InputLength int `json:"input_length"`
		}
		require.NoError(t, json.Unmarshal(line, &r))
		if r.InputLength <= maxInput {
			out = append(out, line...)
			if n--; n == 0 {
				break
			}
		}
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, out, 0o600))
	return path
}

// storedPrefixes returns the prompt tokens of p's requests in leading whole pages that p's
// storage holds (what a prefetch can serve beyond a hit), and in all whole pages.
func storedPrefixes(t *testing.T, p *Plan) (stored, whole int64) {
	t.Helper()
	ctx := context.Background()
	st, ns, err := p.openStorage(ctx)
	require.NoError(t, err)
	defer st.Close()
	P := p.Config.PageSize
	for _, r := range p.Requests {
		hashes := hicache.PrefixHashes(r.Tokens[:len(r.Tokens)/P*P], P)
		keys := make([]storage.Key, len(hashes))
		for i, h := range hashes {
			keys[i] = storage.PageKey(ns, h, 0) // the cache's key: the page id and the TP shard (0: attn_tp is 1)
		}
		n, err := st.Exists(ctx, keys, nil)
		require.NoError(t, err)
		stored += int64(n * P)
		whole += int64(len(hashes) * P)
	}
	return stored, whole
}

// TestSecondRunServesWhatStorageHolds: a second run of a workload against the store its
// first run filled, with prefetches overlapping decode (the default), serves from storage
// at least 95% of what an unlimited cache kept from the first run (every whole page of
// every prompt) would have hit beyond the run's L1 and L2 hits, and misses at most 5% of
// it (for the "storage" cause, or any); CP4, file and Redis stores, the
// synthetic workload and the conversation trace. It served 3-4%: every queued request
// asked storage at once, the locked prefixes filled L2, the reads were refused (no L2
// room, quota) and the requests computed what storage held; the pages a read brought were
// evicted before the prefill by the next reads.
func TestSecondRunServesWhatStorageHolds(t *testing.T) {
	workloads := map[string]func(*testing.T, *Config){
		// 24 conversations arrive at once; their histories (up to 60 pages each) overflow
		// the 256 L2 pages of the group many times.
		"synthetic": func(_ *testing.T, c *Config) {
			c.Synthetic = workload.SyntheticConfig{Clients: 24, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 8, Seed: 5}
			c.PageSize, c.L1Pages, c.L2Pages, c.KVBytesPerToken = 8, 24, 64, 8 // L1: 96 pages over the 4 ranks
		},
		// The first 100 requests of the Mooncake conversation trace with prompts up to 8 K
		// tokens (shared 512-token blocks), on the virtual clock of its timestamps.
		"trace": func(t *testing.T, c *Config) {
			c.Workload, c.TracePath = WorkloadTrace, shortTrace(t, 100, 8192)
			c.PageSize, c.L1Pages, c.L2Pages, c.KVBytesPerToken = 64, 48, 128, 4 // L1: 192 pages over the 4 ranks
		},
	}
	stores := map[string]func(*testing.T, *Config){
		"file": func(t *testing.T, c *Config) { c.Storage = "file://" + t.TempDir() },
		"redis": func(t *testing.T, c *Config) {
			c.Storage = redistest.Start(t).URL("second-run")
			c.StorageKeyFile = filepath.Join(t.TempDir(), "storage.key")
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			require.NoError(t, os.WriteFile(c.StorageKeyFile, []byte(hex.EncodeToString(key)+"\n"), 0o600))
		},
	}
	for wname, wl := range workloads {
		for sname, store := range stores {
			t.Run(wname+"/"+sname, func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.Layout = parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true}
				wl(t, &cfg)
				store(t, &cfg)
				p, err := Prepare(cfg)
				require.NoError(t, err)
				first := runInProcess(t, p, -1)
				requireAgreed(t, p, first)
				stored, warm := storedPrefixes(t, p)
				second := runInProcess(t, p, -1)
				requireAgreed(t, p, second)
				c, m := second[0].counts, second[0].timing.Misses
				beyond := stored - c.HitL1 - c.HitL2 // what storage must serve
				t.Logf("second run: %d prompt tokens, %d in whole pages, %d in stored leading pages, L1 %d, L2 %d, storage %d (%.1f%% of %d beyond L1/L2), missed %d (storage %d, partial pages %d); %d prefetches deferred, %d retried, %d pages refused, %d cut",
					c.InputTokens, warm, stored, c.HitL1, c.HitL2, c.HitL3, 100*float64(c.HitL3)/float64(beyond), beyond, c.Missed, m.Storage, m.PartialPage,
					c.PrefetchDeferrals, c.PrefetchRetries, c.PrefetchRefusedPages, c.PrefetchCutPages)
				require.Greater(t, beyond, c.InputTokens/4, "the workload overflows L2: storage has much to serve")
				assert.GreaterOrEqual(t, float64(c.HitL3), 0.95*float64(beyond), "storage serves ≥ 95%% of what an unlimited cache hits beyond L1 and L2")
				assert.LessOrEqual(t, float64(m.Storage), 0.05*float64(beyond), "misses for the storage cause ≤ 5%% of it")
				assert.LessOrEqual(t, float64(c.Missed-m.PartialPage), 0.05*float64(beyond), "whole pages missed ≤ 5%% of it")
				assert.LessOrEqual(t, c.Missed-m.PartialPage, int64(cfg.PageSize)*(c.PrefetchRefusedPages+c.PrefetchCutPages),
					"every whole page missed is counted refused or cut: none is computed silently")
				assert.Zero(t, c.PrefetchRefusedPages, "no stored page refused for good")
				assert.Zero(t, c.PrefetchCutPages, "best effort: no read is cut")
				assert.Zero(t, c.PrefetchSteps, "prefetches overlap decode")
				for rank, o := range append(first, second...) {
					assert.Zero(t, o.stats.StorageErrors, "rank %d", rank%4)
				}
			})
		}
	}
}
