package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/parallel"
)

// The configuration check of cpcache_open (include/cpcache.h): once the ranks have met, each
// sends the fields of its cpcache_config that must be alike, and every rank compares every
// rank's, so that every rank returns the same verdict before any group or slab is made. A
// difference is CPCACHE_ERR_CONFIG naming the field, two ranks and their values (a storage
// URL shown with its secrets masked). The hicache fingerprint that New compares covers the
// cache's own options too, but names no field, and the storage URL and model (the key
// namespace) are in no fingerprint: ranks with two stores, or two models, each served the
// other's misses.

// Scopes of a compared field.
const (
	scopeJob     = "job"           // every rank of the job
	scopeReplica = "replica group" // every rank of one replica group (one scheduler)
)

// configField is one compared field of a rank's configuration.
type configField struct {
	Name  string `json:"n"`
	Value string `json:"v"` // what is compared
	Shown string `json:"s"` // what an error prints (Value unless the field holds a secret)
	Scope string `json:"-"`
}

// startPayload is what a rank sends at the start agreement: its node generation and its
// compared fields.
type startPayload struct {
	Gen    uint64        `json:"gen"`
	Fields []configField `json:"fields"`
}

// comparedFields are c's fields that every rank of their scope must set alike, in the order
// they are checked: the layout first (the replica groups depend on it). Defaults are filled
// in as the layout and the cache fill them (tp 0 is the world size, dp 0 is 1 ...), so that
// two spellings of one configuration agree. worldSize is the job's.
func comparedFields(c *openConfig, worldSize int) []configField {
	lc := c.layout
	if lc.World == 0 {
		lc.World = worldSize
	}
	if lc.TP == 0 {
		lc.TP = lc.World
	}
	for _, v := range []*int{&lc.DP, &lc.AttnCP, &lc.EP} {
		if *v == 0 {
			*v = 1
		}
	}
	consensus := c.consensus
	if consensus == "" {
		consensus = "auto"
	}
	num := func(name string, v int64, scope string) configField {
		s := strconv.FormatInt(v, 10)
		return configField{Name: name, Value: s, Shown: s, Scope: scope}
	}
	str := func(name, v, scope string) configField {
		s := strconv.Quote(v)
		if len(v) > 200 {
			s = strconv.Quote(v[:200]) + "…"
		}
		return configField{Name: name, Value: v, Shown: s, Scope: scope}
	}
	dpAttention := int64(0)
	if lc.DPAttention {
		dpAttention = 1
	}
	// The storage URL may hold a password: compared by its digest, shown masked.
	sum := sha256.Sum256([]byte(c.storageURL))
	storageURL := configField{Name: "storage_url", Value: hex.EncodeToString(sum[:]), Shown: strconv.Quote(redact.URL(c.storageURL)), Scope: scopeJob}
	if c.storageURL == "" {
		storageURL.Shown = "NULL"
	}
	// The KV layout in its textual form (kvlayout.Layout.String, which Parse reads back):
	// a difference is named by its first differing part (see agreeConfig), before page_bytes,
	// which a different layout changes too.
	kvText := ""
	if c.kv.kvLayout != nil {
		kvText = c.kv.kvLayout.String()
	}
	kv := configField{Name: "kv_layout", Value: kvText, Shown: strconv.Quote(kvText), Scope: scopeJob}
	if kvText == "" {
		kv.Shown = "none (opaque pages)"
	}
	return []configField{
		num("world", int64(lc.World), scopeJob), num("tp", int64(lc.TP), scopeJob), num("dp", int64(lc.DP), scopeJob),
		num("attn_cp", int64(lc.AttnCP), scopeJob), num("ep", int64(lc.EP), scopeJob), num("dp_attention", dpAttention, scopeJob),
		str("consensus", consensus, scopeJob), num("timeout_ms", c.timeoutMs, scopeJob),
		storageURL, str("model", c.model, scopeJob), kv,
		num("page_tokens", int64(c.pageTokens), scopeReplica), num("page_bytes", int64(c.pageBytes), scopeReplica),
		num("slab_backend", int64(c.slabKind), scopeReplica),
		num("l1_pages", int64(c.l1Pages), scopeReplica), num("l2_pages", int64(c.l2Pages), scopeReplica),
		num("policy", int64(c.options.Policy), scopeReplica), num("write_threshold", int64(c.options.WriteThreshold), scopeReplica),
		num("min_load_pages", int64(c.options.MinLoadPages), scopeReplica), num("load_quota_pages", int64(c.options.LoadQuotaPages), scopeReplica),
		num("l1_mode", int64(c.l1ModeIn), scopeReplica),
		// Every rank takes part in the publisher's start (job.Config.KVEvents): alike on all.
		str("kv_events_endpoint", c.kvEvents.Endpoint, scopeJob),
		str("kv_events_replay_endpoint", c.kvEvents.ReplayEndpoint, scopeJob),
		str("kv_events_topic", c.kvEvents.Topic, scopeJob),
	}
}

// encodeStart is this rank's payload for the start agreement.
func encodeStart(c *openConfig, gen uint64, worldSize int) string {
	b, err := json.Marshal(startPayload{Gen: gen, Fields: comparedFields(c, worldSize)})
	if err != nil {
		panic(err) // strings and integers always encode
	}
	return string(b)
}

// agreeConfig judges the payloads of every rank of the job (in rank order), the same way on
// every rank: the highest node generation, or an error wrapping hicache.ErrBadConfig naming
// the first field two ranks of its scope set differently (job-wide fields first, then each
// replica group's, in rank order). A layout that every rank set alike and that is invalid is
// left to parallel.NewLayout (every rank fails alike).
func agreeConfig(payloads []string) (uint64, error) {
	all := make([]startPayload, len(payloads))
	var gen uint64
	for r, p := range payloads {
		if err := json.Unmarshal([]byte(p), &all[r]); err != nil {
			return 0, fmt.Errorf("%w: the start payload of rank %d: %v (a libcpcache of another version?)", hicache.ErrBadConfig, r, err)
		}
		gen = max(gen, all[r].Gen)
	}
	// The scope of each field is this library's, not the peer's (it does not travel): every
	// rank must send as many fields as this library compares.
	local := comparedFields(&openConfig{}, 1)
	for r := range all {
		if len(all[r].Fields) != len(local) {
			return 0, fmt.Errorf("%w: rank %d compares %d configuration fields, this library %d (a libcpcache of another version?)",
				hicache.ErrBadConfig, r, len(all[r].Fields), len(local))
		}
	}
	differ := func(i, ref, r int) error {
		a, b := all[ref].Fields[i], all[r].Fields[i]
		if a.Name != b.Name {
			return fmt.Errorf("%w: rank %d sent configuration field %q where rank %d sent %q (a libcpcache of another version?)", hicache.ErrBadConfig, r, b.Name, ref, a.Name)
		}
		if a.Value == b.Value {
			return nil
		}
		shown := fmt.Sprintf("rank %d has %s, rank %d has %s", ref, a.Shown, r, b.Shown)
		if a.Shown == b.Shown {
			shown = fmt.Sprintf("ranks %d and %d set values that differ only in a secret (shown masked: %s)", ref, r, a.Shown)
		}
		scope := "the job"
		if local[i].Scope == scopeReplica {
			scope = "a replica group"
		}
		if a.Name == "kv_layout" {
			return kvLayoutDiffers(ref, r, a.Value, b.Value)
		}
		return fmt.Errorf("%w: ranks disagree on %s: %s (every rank of %s must set it alike)", hicache.ErrBadConfig, a.Name, shown, scope)
	}
	for i := range local {
		if local[i].Scope != scopeJob {
			continue
		}
		for r := range all {
			if err := differ(i, 0, r); err != nil {
				return 0, err
			}
		}
	}
	layout, err := parallel.NewLayout(layoutOf(all[0].Fields, len(all)))
	if err != nil || layout.Config.World != len(all) {
		return gen, nil // every rank fails alike where it builds the layout
	}
	for i := range local {
		if local[i].Scope != scopeReplica {
			continue
		}
		for r := range all {
			if err := differ(i, layout.ReplicaGroup(r)[0], r); err != nil {
				return 0, err
			}
		}
	}
	return gen, nil
}

// kvLayoutDiffers is the error of ranks ref and r whose KV layouts (textual forms a and b,
// "" for none) differ: it names the first differing part, its name, bytes per token and
// sharding as each rank set them.
func kvLayoutDiffers(ref, r int, a, b string) error {
	what := ""
	switch {
	case a == "":
		what = fmt.Sprintf("rank %d has none (opaque pages), rank %d has %q", ref, r, b)
	case b == "":
		what = fmt.Sprintf("rank %d has %q, rank %d has none (opaque pages)", ref, a, r)
	default:
		la, errA := kvlayout.Parse(a)
		lb, errB := kvlayout.Parse(b)
		d := ""
		if errA == nil && errB == nil {
			d = la.Diff(lb)
		}
		if d == "" { // cannot happen: String's forms parse, and unequal texts are unequal layouts
			d = "they differ"
		}
		what = fmt.Sprintf("%s (rank %d first, then rank %d; rank %d has %q, rank %d has %q)", d, ref, r, ref, a, r, b)
	}
	return fmt.Errorf("%w: ranks disagree on the KV layout (kv_layout, kv_parts): %s (every rank of the job must set it alike)", hicache.ErrBadConfig, what)
}

// layoutOf is the layout a rank's compared fields describe (comparedFields' first six).
func layoutOf(fields []configField, worldSize int) parallel.LayoutConfig {
	v := map[string]int{}
	for _, f := range fields[:min(6, len(fields))] {
		v[f.Name], _ = strconv.Atoi(f.Value)
	}
	if v["world"] == 0 {
		v["world"] = worldSize
	}
	return parallel.LayoutConfig{World: v["world"], TP: v["tp"], DP: v["dp"], AttnCP: v["attn_cp"], EP: v["ep"], DPAttention: v["dp_attention"] != 0}
}
