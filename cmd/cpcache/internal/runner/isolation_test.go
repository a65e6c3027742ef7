package runner

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/workload"
)

// TestIsolationPerClientSharesNoPrefix runs 6 conversations of 3 turns on CP4 whose prompts
// all start with the same 64-token system prompt (8 pages), in an L1 that evicts nothing.
// Per client, no first turn hits (each client's system prompt is under its own key) and
// every later turn hits exactly its own previous turn's whole pages; with no isolation the
// later turns hit the same, and every first turn but the first served hits the 64 shared
// tokens.
func TestIsolationPerClientSharesNoPrefix(t *testing.T) {
	const system, P = 64, 8
	for _, mode := range []string{IsolationNone, IsolationPerClient} {
		t.Run(mode, func(t *testing.T) {
			p := smallPlan(t, parallel.LayoutConfig{World: 4, AttnCP: 4}, func(c *Config) {
				c.Synthetic = workload.SyntheticConfig{Clients: 6, Rounds: 3, SystemTokens: system, QuestionTokens: 96, AnswerTokens: 8, Seed: 5}
				c.L1Pages, c.L2Pages, c.Isolation = 1024, 1024, mode
			})
			var mu sync.Mutex
			hits := map[int]int64{} // request ID: hit tokens, as rank 0 counted them
			order := []int{}        // request IDs in the order rank 0 prefilled them
			out := runInProcessWith(t, p, inProcessOptions{corruptRank: -1, onPrefilled: func(rank int, r workload.Request, hit int64) {
				if rank == 0 {
					mu.Lock()
					defer mu.Unlock()
					hits[r.ID] = hit
					order = append(order, r.ID)
				}
			}})
			requireAgreed(t, p, out)
			require.Len(t, hits, len(p.Requests))
			assert.Zero(t, out[0].stats.EvictedL1Pages, "L1 holds every conversation")
			firstServed := -1
			for _, id := range order {
				if p.Requests[id].Round == 0 {
					firstServed = id
					break
				}
			}
			prev := map[int]workload.Request{} // client: its previous turn
			var total int64
			for _, r := range p.Requests {
				want := int64(0)
				switch {
				case r.Round > 0:
					pr := prev[r.Client]
					want = int64((len(pr.Tokens) + pr.OutputLen) / P * P) // its own previous turn, answer included
				case mode == IsolationNone && r.ID != firstServed:
					want = system // the system prompt another client's first turn inserted
				}
				assert.Equal(t, want, hits[r.ID], "%s: request %d (client %d, turn %d)", mode, r.ID, r.Client, r.Round)
				prev[r.Client] = r
				total += hits[r.ID]
			}
			assert.Equal(t, workload.ReuseBound(p.Requests, P), total, "the reuse bound counts what the keys allow")
		})
	}
}

// TestPrepareRejectsBadIsolation refuses an isolation mode the workload cannot have, naming
// the value, before any rank starts (Prepare runs before the launch).
func TestPrepareRejectsBadIsolation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Isolation = "per-user"
	_, err := Prepare(cfg)
	require.ErrorIs(t, err, ErrBadInput)
	assert.ErrorContains(t, err, `--isolation "per-user" (want none, per-client or per-tenant)`)

	cfg.Isolation = IsolationPerTenant
	_, err = Prepare(cfg)
	require.ErrorIs(t, err, ErrBadInput)
	assert.ErrorContains(t, err, "--isolation per-tenant needs --workload trace")
}

// TestIsolationPerTenantOfATrace serves a trace of two tenants on CP4 whose first prompts
// are the same two blocks, then a repeat of each with a block of its own added. Per tenant,
// the second tenant's first prompt hits nothing of the first's while each repeat hits its
// own tenant's first prompt (1024 tokens); with no isolation the second first prompt hits
// the first's 1024 tokens.
func TestIsolationPerTenantOfATrace(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2], "tenant": "a"}
{"timestamp": 1000, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2], "tenant": "b"}
{"timestamp": 2000, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3], "tenant": "a"}
{"timestamp": 3000, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 4], "tenant": "b"}
`
	path := filepath.Join(t.TempDir(), "tenants.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(trace), 0o600))
	want := map[string][]int64{IsolationNone: {0, 1024, 1024, 1024}, IsolationPerTenant: {0, 0, 1024, 1024}}
	for _, mode := range []string{IsolationNone, IsolationPerTenant} {
		t.Run(mode, func(t *testing.T) {
			p := smallPlan(t, parallel.LayoutConfig{World: 4, AttnCP: 4}, func(c *Config) {
				c.Workload, c.TracePath, c.Isolation = WorkloadTrace, path, mode
				c.L1Pages, c.L2Pages = 1024, 1024
			})
			var mu sync.Mutex
			hits := make([]int64, len(p.Requests))
			out := runInProcessWith(t, p, inProcessOptions{corruptRank: -1, onPrefilled: func(rank int, r workload.Request, hit int64) {
				if rank == 0 {
					mu.Lock()
					defer mu.Unlock()
					hits[r.ID] = hit
				}
			}})
			requireAgreed(t, p, out)
			assert.Equal(t, want[mode], hits)
		})
	}
}

// TestPerTenantNeedsATenantOnEveryLine refuses per-tenant isolation of a trace with a line
// without a tenant (a Mooncake trace has none), naming the flag and the request, and a
// tenant that is not a string, naming the field and its value.
func TestPerTenantNeedsATenantOnEveryLine(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ trace, err string }{
		"missing": {`{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1], "tenant": "a"}
{"timestamp": 1, "input_length": 8, "output_length": 1, "hash_ids": [1]}
`, `--isolation per-tenant: request 1 of the trace has no "tenant" field`},
		"number": {`{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1], "tenant": 7}
`, "line 1: invalid JSON: tenant 7 is not a string"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".jsonl")
			require.NoError(t, os.WriteFile(path, []byte(c.trace), 0o600))
			cfg := DefaultConfig()
			cfg.Workload, cfg.TracePath, cfg.Isolation = WorkloadTrace, path, IsolationPerTenant
			_, err := Prepare(cfg)
			require.ErrorIs(t, err, ErrBadInput)
			assert.ErrorContains(t, err, c.err)
		})
	}
}
