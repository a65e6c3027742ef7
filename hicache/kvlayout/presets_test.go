package kvlayout

import (
	"slices"
	"strings"
	"testing"
)

// Every preset validates, and one rank's bytes are what the model's config gives, computed
// here from the config's figures and asserted as literals too.
func TestPresetSizesFollowTheModelConfigs(t *testing.T) {
	const llama8bPart = 8 * 128 * 2       // num_key_value_heads × head_dim × bf16
	const deepseekLatent = (512 + 64) * 2 // (kv_lora_rank + qk_rope_head_dim) × bf16
	for _, c := range []struct {
		preset     string
		pageTokens int
		attnTP     int
		token      int64 // BytesPerToken(attnTP)
		page       int64 // PageBytes(pageTokens, attnTP)
		literal    int64 // page, written out
		chunk      int   // PartBytesPerToken(0, attnTP) × pageTokens: one (layer, part) chunk of a page
	}{
		{"llama-3-8b", 16, 1, 32 * 2 * llama8bPart, 32 * 2 * llama8bPart * 16, 2 << 20, 32 << 10},
		{"llama-3-8b", 16, 2, 32 * 2 * llama8bPart / 2, 32 * 2 * llama8bPart / 2 * 16, 1 << 20, 16 << 10},
		{"llama-3-8b", 16, 8, 32 * 2 * 128 * 2, 32 * 2 * 128 * 2 * 16, 256 << 10, 4 << 10},
		{"llama-3-8b", 1, 1, 32 * 2 * llama8bPart, 32 * 2 * llama8bPart, 128 << 10, 2048},
		{"llama-3-70b", 16, 1, 80 * 2 * 8 * 128 * 2, 80 * 2 * 8 * 128 * 2 * 16, 5 << 20, 32 << 10},
		// TP8: one KV head per rank, 128 × bf16 = 256 bytes of K and of V per token and layer.
		{"llama-3-70b", 16, 8, 80 * 2 * 1 * 128 * 2, 80 * 2 * 1 * 128 * 2 * 16, 640 << 10, 4 << 10},
		{"deepseek-v3", 64, 1, 61 * deepseekLatent, 61 * deepseekLatent * 64, 4497408, 72 << 10},
		{"deepseek-v3", 64, 4, 61 * deepseekLatent, 61 * deepseekLatent * 64, 4497408, 72 << 10},
		{"deepseek-v3", 64, 8, 61 * deepseekLatent, 61 * deepseekLatent * 64, 4497408, 72 << 10},
		{"deepseek-v3", 64, 7, 61 * deepseekLatent, 61 * deepseekLatent * 64, 4497408, 72 << 10},
		{"deepseek-v3", 1, 1, 70272, 70272, 70272, 1152},
		{"llama-3-8b-indexer", 16, 1, 32 * (2*llama8bPart + 128), 32 * (2*llama8bPart + 128) * 16, 2162688, 32 << 10},
		{"llama-3-8b-indexer", 16, 8, 32 * (2*llama8bPart/8 + 128), 32 * (2*llama8bPart/8 + 128) * 16, 327680, 4 << 10},
	} {
		l, err := Preset(c.preset)
		if err != nil {
			t.Fatalf("%s: %v", c.preset, err)
		}
		if err := l.Validate(); err != nil {
			t.Errorf("%s: %v", c.preset, err)
		}
		if c.page != c.literal {
			t.Fatalf("%s: the config's page bytes %d are not the literal %d", c.preset, c.page, c.literal)
		}
		tok, err := l.BytesPerToken(c.attnTP)
		if err != nil || tok != c.token {
			t.Errorf("%s at attnTP %d: BytesPerToken = %d, %v; want %d", c.preset, c.attnTP, tok, err, c.token)
		}
		page, err := l.PageBytes(c.pageTokens, c.attnTP)
		if err != nil || page != c.page {
			t.Errorf("%s at %d tokens per page, attnTP %d: PageBytes = %d, %v; want %d", c.preset, c.pageTokens, c.attnTP, page, err, c.page)
		}
		part, err := l.PartBytesPerToken(0, c.attnTP)
		if err != nil || part*c.pageTokens != c.chunk {
			t.Errorf("%s at attnTP %d: part 0's chunk is %d × %d, %v; want %d", c.preset, c.attnTP, part, c.pageTokens, err, c.chunk)
		}
	}
}

func TestPresetShapes(t *testing.T) {
	for _, c := range []struct {
		preset     string
		text       string
		replicated bool
	}{
		{"llama-3-8b", "layers=32;k=2048:sharded;v=2048:sharded", false},
		{"llama-3-70b", "layers=80;k=2048:sharded;v=2048:sharded", false},
		{"deepseek-v3", "layers=61;kv=1152:replicated", true},
		{"llama-3-8b-indexer", "layers=32;k=2048:sharded;v=2048:sharded;indexer=128:replicated", false},
	} {
		l, err := Preset(c.preset)
		if err != nil {
			t.Fatalf("%s: %v", c.preset, err)
		}
		if got := l.String(); got != c.text {
			t.Errorf("%s: %q, want %q", c.preset, got, c.text)
		}
		if got := l.AllReplicated(); got != c.replicated {
			t.Errorf("%s: AllReplicated = %v", c.preset, got)
		}
		parsed, err := Parse(c.preset)
		if err != nil || parsed.Diff(l) != "" {
			t.Errorf("Parse(%q) = %v, %v; differs from the preset: %s", c.preset, parsed, err, parsed.Diff(l))
		}
	}
}

func TestPresetNames(t *testing.T) {
	names := PresetNames()
	want := []string{"deepseek-v3", "llama-3-70b", "llama-3-8b", "llama-3-8b-indexer"}
	if !slices.Equal(names, want) {
		t.Errorf("PresetNames = %v, want %v", names, want)
	}
	fingerprints := map[string]string{}
	for _, name := range names {
		l, err := Preset(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if other, dup := fingerprints[l.Fingerprint()]; dup {
			t.Errorf("presets %s and %s share the fingerprint %s", other, name, l.Fingerprint())
		}
		fingerprints[l.Fingerprint()] = name
	}
}

func TestPresetReturnsAFreshCopy(t *testing.T) {
	a, _ := Preset("llama-3-8b")
	a.Parts[0].BytesPerToken = 1
	a.Parts = append(a.Parts, Part{"x", 1, Replicated})
	b, _ := Preset("llama-3-8b")
	if b.String() != "layers=32;k=2048:sharded;v=2048:sharded" {
		t.Errorf("changing one preset's result changed the next: %v", b)
	}
}

func TestUnknownPresetListsTheKnownOnes(t *testing.T) {
	for _, name := range []string{"llama-3-7b", "", "Llama-3-8B"} {
		_, err := Preset(name)
		wantErr(t, err, -1, "", "unknown preset")
		msg := err.Error()
		if !strings.Contains(msg, "known: deepseek-v3, llama-3-70b, llama-3-8b, llama-3-8b-indexer") {
			t.Errorf("Preset(%q): %q does not list the known presets", name, msg)
		}
		_, perr := Parse(name)
		if name != "" && (perr == nil || perr.Error() != msg) {
			t.Errorf("Parse(%q) = %v, want Preset's error %q", name, perr, msg)
		}
	}
}
