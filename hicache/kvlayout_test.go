package hicache

import (
	"errors"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/parallel"
)

func mustKVLayout(t *testing.T, s string) *kvlayout.Layout {
	t.Helper()
	l, err := kvlayout.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return &l
}

// newOnEveryRank's pages: 4 tokens of 64 bytes, attention-TP 1, so 16 bytes per token.
const kvLayout16 = "layers=2;k=4:sharded;v=4:sharded"

// Ranks given equal KV layouts that fit the slab page start; no layout anywhere starts too.
func TestNewKVLayoutEqualStarts(t *testing.T) {
	for _, kv := range []string{kvLayout16, ""} {
		errs := newOnEveryRank(t, 4, func(i int, cfg *Config) {
			if kv != "" {
				cfg.KVLayout = mustKVLayout(t, kv)
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("layout %q: %v", kv, err)
		}
	}
}

// One rank with another layout: every rank fails with the same *LayoutMismatchError naming
// that rank and the differing part, even though that rank's layout also does not fit the
// slab page (the layout is the cause, and it is what every rank reports).
func TestNewKVLayoutMismatchNamesThePart(t *testing.T) {
	const n, bad = 4, 2
	errs := newOnEveryRank(t, n, func(i int, cfg *Config) {
		cfg.KVLayout = mustKVLayout(t, kvLayout16)
		if i >= bad { // ranks 2 and 3 differ; the lowest is named
			cfg.KVLayout = mustKVLayout(t, "layers=2;k=4:sharded;v=2:sharded")
		}
	})
	for i, err := range errs {
		var me *LayoutMismatchError
		if !errors.As(err, &me) || !errors.Is(err, ErrLayoutMismatch) || me.Rank != bad || me.First != 0 || err.Error() != errs[0].Error() {
			t.Fatalf("rank %d: %v; want the LayoutMismatchError of rank %d, identical on every rank", i, err, bad)
		}
		if want := "part 1 (v): bytes per token 4 vs 2"; me.Diff != want || !strings.Contains(err.Error(), want) {
			t.Fatalf("rank %d: diff %q, want %q", i, me.Diff, want)
		}
	}
	t.Log(errs[0])
}

// A rank without a layout among ranks with one is a mismatch too.
func TestNewKVLayoutMissingOnOneRank(t *testing.T) {
	errs := newOnEveryRank(t, 2, func(i int, cfg *Config) {
		if i == 0 {
			cfg.KVLayout = mustKVLayout(t, kvLayout16)
		}
	})
	for i, err := range errs {
		var me *LayoutMismatchError
		if !errors.As(err, &me) || me.Rank != 1 || me.Diff != kvLayout16+" vs no KV layout" {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

// A layout whose page is not the slab page size fails New, naming both sizes.
func TestNewKVLayoutPageBytes(t *testing.T) {
	errs := newOnEveryRank(t, 2, func(i int, cfg *Config) {
		cfg.KVLayout = mustKVLayout(t, "layers=2;k=8:sharded;v=8:sharded")
	})
	for i, err := range errs {
		if !errors.Is(err, ErrPeerFailed) || !strings.Contains(err.Error(), "takes 128 bytes per page of 4 tokens") || !strings.Contains(err.Error(), "slab page size is 64 bytes") {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	// A layout that does not split over the attention-TP size is a bad configuration too.
	if err := checkKVLayout(mustKVLayout(t, "layers=1;k=3:sharded"), 4, 2, 64); !errors.Is(err, ErrBadConfig) || !errors.Is(err, kvlayout.ErrBadLayout) {
		t.Fatalf("indivisible layout: %v", err)
	}
}

// TestStorageNamespaceKVLayout: a KV layout's fingerprint joins the namespace (two layouts
// with the same page bytes give different namespaces, the same layout the same one), and
// without one the namespace is exactly the one stores already hold.
func TestStorageNamespaceKVLayout(t *testing.T) {
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: 2, AttnCP: 2})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := kvlayout.Preset("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	pageBytes64, err := kv.PageBytes(16, l.AttnTP)
	if err != nil {
		t.Fatal(err)
	}
	pageBytes := int(pageBytes64)
	none, err := NewStorageNamespace("llama-3-8b", l, 16, pageBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	const oldIdentity = "cpcache/hicache;model=llama-3-8b;page_tokens=16;page_bytes=2097152;attn_tp=1"
	if none.Identity() != oldIdentity || none.String()[:16] != "b81f32e9fd7c56ab" {
		t.Fatalf("namespace without a layout is %q (%s), want %q (b81f32e9fd7c56ab...)", none.Identity(), none, oldIdentity)
	}
	mk := func(kv *kvlayout.Layout) string {
		ns, err := NewStorageNamespace("llama-3-8b", l, 16, pageBytes, kv)
		if err != nil {
			t.Fatal(err)
		}
		return ns.String()
	}
	same := kv.Clone()
	// Same page bytes, different split between K and V.
	other := kv.Clone()
	other.Parts[0].BytesPerToken, other.Parts[1].BytesPerToken = 1024, 3072
	if a, b := mk(&kv), mk(&same); a != b {
		t.Fatalf("same layout, namespaces %s and %s", a, b)
	}
	if a, b := mk(&kv), mk(&other); a == b || a == none.String() {
		t.Fatalf("layouts %s and %s share namespace %s (without a layout: %s)", kv, other, a, none)
	}
	if _, err := NewStorageNamespace("llama-3-8b", l, 16, pageBytes/2, &kv); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "2097152") {
		t.Fatalf("layout not fitting the page: %v", err)
	}
}
