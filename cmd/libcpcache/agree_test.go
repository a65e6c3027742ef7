package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvlayout"
)

// agreeOf runs agreeConfig over the configurations of a job's ranks, as every rank does.
func agreeOf(cfgs []openConfig, gens ...uint64) (uint64, error) {
	payloads := make([]string, len(cfgs))
	for r := range cfgs {
		var g uint64
		if r < len(gens) {
			g = gens[r]
		}
		payloads[r] = encodeStart(&cfgs[r], g, len(cfgs))
	}
	return agreeConfig(payloads)
}

// TestAgreeConfigNamesTheField: ranks whose configurations differ fail alike, with an error
// naming the field and both values, storage_url and model included.
func TestAgreeConfigNamesTheField(t *testing.T) {
	two := func(edit func(*openConfig)) []openConfig {
		a, b := goodConfig(), goodConfig()
		a.layout.AttnCP, b.layout.AttnCP = 2, 2
		a.timeoutMs, b.timeoutMs = 60000, 60000
		a.storageURL, b.storageURL, a.model, b.model = "file:///l3", "file:///l3", "m", "m"
		l, _ := kvlayout.Parse("layers=2;k=16:sharded;v=16:sharded")
		a.kv.kvLayout, b.kv.kvLayout = &l, &l
		edit(&b)
		return []openConfig{a, b}
	}
	if gen, err := agreeOf(two(func(*openConfig) {}), 3, 7); err != nil || gen != 7 {
		t.Fatalf("alike: gen %d, %v; want 7, nil", gen, err)
	}
	// Two spellings of one layout agree: tp 0 is the world size, attn_cp 0 is 1.
	if _, err := agreeOf(two(func(c *openConfig) { c.layout.TP, c.layout.World = 2, 2 })); err != nil {
		t.Errorf("tp 0 and tp 2 in a world of 2: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*openConfig)
		want string
	}{
		{"model", func(c *openConfig) { c.model = "other" }, `ranks disagree on model: rank 0 has "m", rank 1 has "other"`},
		{"storage url", func(c *openConfig) { c.storageURL = "file:///elsewhere" }, `storage_url: rank 0 has "file:///l3", rank 1 has "file:///elsewhere"`},
		{"no storage", func(c *openConfig) { c.storageURL = "" }, `storage_url: rank 0 has "file:///l3", rank 1 has NULL`},
		{"layout", func(c *openConfig) { c.layout.AttnCP = 1 }, "attn_cp: rank 0 has 2, rank 1 has 1"},
		{"consensus", func(c *openConfig) { c.consensus = "gloo" }, `consensus: rank 0 has "auto", rank 1 has "gloo"`},
		{"timeout", func(c *openConfig) { c.timeoutMs = 5 }, "timeout_ms: rank 0 has 60000, rank 1 has 5"},
		{"l1 pages", func(c *openConfig) { c.l1Pages = 9 }, "l1_pages: rank 0 has 8, rank 1 has 9"},
		{"page tokens", func(c *openConfig) { c.pageTokens = 32 }, "page_tokens: rank 0 has 16, rank 1 has 32"},
		{"policy", func(c *openConfig) { c.options.Policy = hicache.WriteBack }, "policy: rank 0 has 0, rank 1 has 2"},
		{"kv events", func(c *openConfig) { c.kvEvents.Endpoint = "tcp://*:5557" }, `kv_events_endpoint: rank 0 has "", rank 1 has "tcp://*:5557"`},
		{"kv events replay", func(c *openConfig) { c.kvEvents.ReplayEndpoint = "tcp://*:5558" }, `kv_events_replay_endpoint: rank 0 has "", rank 1 has "tcp://*:5558"`},
		{"kv events topic", func(c *openConfig) { c.kvEvents.Topic = "t" }, `kv_events_topic: rank 0 has "", rank 1 has "t"`},
		// A KV layout that differs in one part's size (and so in page_bytes too) names the
		// part, not page_bytes; one rank without a layout is named as such.
		{"kv layout", func(c *openConfig) {
			l, _ := kvlayout.Parse("layers=2;k=32:sharded;v=16:sharded")
			c.kv.kvLayout, c.pageBytes = &l, 384
		}, "ranks disagree on the KV layout (kv_layout, kv_parts): part 0 (k): bytes per token 16 vs 32"},
		{"kv layout sharding", func(c *openConfig) {
			l, _ := kvlayout.Parse("layers=2;k=16:sharded;v=16:replicated")
			c.kv.kvLayout = &l
		}, "part 1 (v): sharding sharded vs replicated"},
		{"no kv layout", func(c *openConfig) { c.kv.kvLayout = nil }, `rank 1 has none (opaque pages)`},
		{"l1 mode", func(c *openConfig) { c.l1ModeIn, c.options.L1Mode = 1, hicache.EngineOwned }, "l1_mode: rank 0 has 0, rank 1 has 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := agreeOf(two(tc.edit))
			if !errors.Is(err, hicache.ErrBadConfig) || statusOf(err) != -6 {
				t.Fatalf("err = %v, want hicache.ErrBadConfig (CPCACHE_ERR_CONFIG)", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tc.want)
			}
		})
	}
	// A storage URL's password is compared, never printed.
	_, err := agreeOf(two(func(c *openConfig) { c.storageURL = "redis://:hunter2@h:6379/p" }))
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "xxxxx@h:6379/p") {
		t.Errorf("password URL: %v, want the URL masked", err)
	}
	cfgs := two(func(c *openConfig) { c.storageURL = "redis://:one@h:6379/p" })
	cfgs[0].storageURL = "redis://:two@h:6379/p"
	_, err = agreeOf(cfgs)
	if err == nil || strings.Contains(err.Error(), "one@") || strings.Contains(err.Error(), "two@") || !strings.Contains(err.Error(), "differ only in a secret") {
		t.Errorf("URLs differing in their password: %v", err)
	}
}

// TestAgreeConfigReplicaScope: the cache's own fields need to agree within each replica group
// (one scheduler), the layout and storage across the job.
func TestAgreeConfigReplicaScope(t *testing.T) {
	cfgs := make([]openConfig, 4) // CP2·DP2 with DP attention: replica groups {0,1} and {2,3}
	for r := range cfgs {
		cfgs[r] = goodConfig()
		cfgs[r].layout.AttnCP, cfgs[r].layout.DP, cfgs[r].layout.DPAttention = 2, 2, true
		cfgs[r].l1Pages = 8 + 8*(r/2)
	}
	if _, err := agreeOf(cfgs); err != nil {
		t.Fatalf("replica groups configured apart, each alike: %v", err)
	}
	cfgs[3].l1Pages = 4
	_, err := agreeOf(cfgs)
	if !errors.Is(err, hicache.ErrBadConfig) || !strings.Contains(err.Error(), "l1_pages: rank 2 has 16, rank 3 has 4 (every rank of a replica group") {
		t.Fatalf("err = %v, want l1_pages of ranks 2 and 3 named", err)
	}
	cfgs[3].l1Pages, cfgs[3].model = 16, "x"
	if _, err := agreeOf(cfgs); err == nil || !strings.Contains(err.Error(), `rank 0 has "", rank 3 has "x" (every rank of the job`) {
		t.Fatalf("err = %v, want the model named job-wide", err)
	}
}

// TestAgreeConfigRefusesAnotherVersion: payloads with fewer or more compared fields than
// this library compares (another libcpcache on some rank) are CPCACHE_ERR_CONFIG on every
// rank, not an index past the fields a rank sent (a panic, CPCACHE_ERR_INTERNAL).
func TestAgreeConfigRefusesAnotherVersion(t *testing.T) {
	c := goodConfig()
	full := comparedFields(&c, 2)
	for _, n := range []int{len(full) - 1, 3, 0} {
		b, err := json.Marshal(startPayload{Fields: full[:n]})
		if err != nil {
			t.Fatal(err)
		}
		var gen uint64
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			gen, err = agreeConfig([]string{string(b), string(b)})
		}()
		if !errors.Is(err, hicache.ErrBadConfig) || !strings.Contains(err.Error(), "another version") {
			t.Errorf("%d of %d fields on every rank: gen %d, %v; want ErrBadConfig naming another version", n, len(full), gen, err)
		}
	}
}
