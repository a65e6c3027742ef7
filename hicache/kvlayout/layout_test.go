package kvlayout

import (
	"errors"
	"strings"
	"testing"
)

// kv is a two-part MHA layout of the given bytes per token per part.
func kv(layers, b int) Layout {
	return Layout{NumLayers: layers, Parts: []Part{{"k", b, Sharded}, {"v", b, Sharded}}}
}

// wantErr checks that err is an *Error wrapping ErrBadLayout for part index (and name), its
// message containing reason.
func wantErr(t *testing.T, err error, index int, part, reason string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want an *Error", err, err)
	}
	if !errors.Is(err, ErrBadLayout) {
		t.Errorf("error %v does not wrap ErrBadLayout", err)
	}
	if e.Index != index || e.Part != part || !strings.Contains(e.Error(), reason) {
		t.Errorf("error %q (index %d, part %q), want index %d, part %q, containing %q", e, e.Index, e.Part, index, part, reason)
	}
}

func TestValidateAcceptsLayouts(t *testing.T) {
	for _, l := range []Layout{
		kv(1, 1),
		kv(MaxLayers, MaxPartBytes/MaxLayers),
		kv(MaxLayers, 1<<26-1), // one byte per part below the overflow of TestValidateNamesTheBadPart
		{NumLayers: 61, Parts: []Part{{"kv", 1152, Replicated}}},
		{NumLayers: 2, Parts: []Part{{"K.draft_0-x", 3, Sharded}, {"idx", 128, Replicated}}},
		{NumLayers: 1, Parts: []Part{{strings.Repeat("a", MaxNameLen), 1, Replicated}}},
	} {
		if err := l.Validate(); err != nil {
			t.Errorf("%v: %v", l, err)
		}
	}
}

func TestValidateNamesTheBadPart(t *testing.T) {
	many := make([]Part, MaxParts+1)
	for i := range many {
		many[i] = Part{"p" + strings.Repeat("x", i%50) + string(rune('a'+i%26)), 1, Sharded}
	}
	for _, c := range []struct {
		name   string
		l      Layout
		index  int
		part   string
		reason string
	}{
		{"zero layers", Layout{Parts: kv(1, 2).Parts}, -1, "", "layer count 0 is not positive"},
		{"negative layers", Layout{NumLayers: -3, Parts: kv(1, 2).Parts}, -1, "", "layer count -3 is not positive"},
		{"too many layers", Layout{NumLayers: MaxLayers + 1, Parts: kv(1, 2).Parts}, -1, "", "exceeds 65536"},
		{"no parts", Layout{NumLayers: 32}, -1, "", "no parts"},
		{"too many parts", Layout{NumLayers: 1, Parts: many}, -1, "", "257 parts exceed 256"},
		{"empty name", Layout{NumLayers: 1, Parts: []Part{{"k", 1, Sharded}, {"", 1, Sharded}}}, 1, "", "empty name"},
		{"duplicate name", Layout{NumLayers: 1, Parts: []Part{{"k", 1, Sharded}, {"v", 1, Sharded}, {"k", 1, Sharded}}}, 2, "k", "duplicate name (part 0 has it)"},
		{"reserved name", Layout{NumLayers: 1, Parts: []Part{{"layers", 1, Sharded}}}, 0, "layers", "reserved"},
		{"name starts with a digit", Layout{NumLayers: 1, Parts: []Part{{"0k", 1, Sharded}}}, 0, "0k", "does not start with a letter"},
		{"name with a separator", Layout{NumLayers: 1, Parts: []Part{{"k;v", 1, Sharded}}}, 0, "k;v", "';'"},
		{"name with a space", Layout{NumLayers: 1, Parts: []Part{{"k v", 1, Sharded}}}, 0, "k v", "' '"},
		{"long name", Layout{NumLayers: 1, Parts: []Part{{strings.Repeat("a", MaxNameLen+1), 1, Sharded}}}, 0, strings.Repeat("a", MaxNameLen+1), "longer than 64"},
		{"zero bytes", Layout{NumLayers: 1, Parts: []Part{{"k", 2048, Sharded}, {"v", 0, Sharded}}}, 1, "v", "bytes per token 0 is not positive"},
		{"negative bytes", Layout{NumLayers: 1, Parts: []Part{{"k", -1, Sharded}}}, 0, "k", "bytes per token -1 is not positive"},
		{"huge part", Layout{NumLayers: 1, Parts: []Part{{"k", MaxPartBytes + 1, Sharded}}}, 0, "k", "exceed 1073741824"},
		{"no sharding", Layout{NumLayers: 1, Parts: []Part{{"k", 1, Sharded}, {"v", 1, 0}}}, 1, "v", "sharding sharding(0) is neither"},
		{"unknown sharding", Layout{NumLayers: 1, Parts: []Part{{"k", 1, 7}}}, 0, "k", "sharding(7)"},
		// 65536 layers × 2^30 bytes × 2^20 tokens is 2^66: the first part already overflows.
		{"overflow in the first part", kv(MaxLayers, MaxPartBytes), 0, "k", "overflows"},
		// 2^16 layers × (2^26 + 2^26) bytes × 2^20 tokens is 2^63: the second part overflows.
		{"overflow in the sum", kv(MaxLayers, 1<<26), 1, "v", "overflows"},
	} {
		t.Run(c.name, func(t *testing.T) { wantErr(t, c.l.Validate(), c.index, c.part, c.reason) })
	}
}

func TestPerRankBytes(t *testing.T) {
	mixed := Layout{NumLayers: 4, Parts: []Part{{"k", 96, Sharded}, {"v", 96, Sharded}, {"idx", 10, Replicated}}}
	for _, c := range []struct {
		attnTP     int
		pageTokens int
		part       []int // per part
		token      int64
		page       int64
	}{
		{1, 1, []int{96, 96, 10}, 4 * 202, 4 * 202},
		{2, 16, []int{48, 48, 10}, 4 * 106, 4 * 106 * 16},
		{3, 7, []int{32, 32, 10}, 4 * 74, 4 * 74 * 7},
		{96, 1, []int{1, 1, 10}, 4 * 12, 4 * 12},
	} {
		for i, want := range c.part {
			got, err := mixed.PartBytesPerToken(i, c.attnTP)
			if err != nil || got != want {
				t.Errorf("attnTP %d: PartBytesPerToken(%d) = %d, %v; want %d", c.attnTP, i, got, err, want)
			}
		}
		if got, err := mixed.BytesPerToken(c.attnTP); err != nil || got != c.token {
			t.Errorf("attnTP %d: BytesPerToken = %d, %v; want %d", c.attnTP, got, err, c.token)
		}
		if got, err := mixed.PageBytes(c.pageTokens, c.attnTP); err != nil || got != c.page {
			t.Errorf("attnTP %d: PageBytes(%d) = %d, %v; want %d", c.attnTP, c.pageTokens, got, err, c.page)
		}
	}
}

func TestPerRankBytesErrors(t *testing.T) {
	l := Layout{NumLayers: 2, Parts: []Part{{"kv", 576, Replicated}, {"k", 100, Sharded}}}
	_, err := l.BytesPerToken(3)
	wantErr(t, err, 1, "k", "bytes per token 100 are not divisible by attention-TP 3")
	_, err = l.PageBytes(16, 8)
	wantErr(t, err, 1, "k", "not divisible by attention-TP 8")
	_, err = l.PartBytesPerToken(1, 6)
	wantErr(t, err, 1, "k", "not divisible by attention-TP 6")
	if b, err := l.PartBytesPerToken(0, 7); err != nil || b != 576 {
		t.Errorf("replicated part at attnTP 7: %d, %v; want 576", b, err)
	}
	_, err = l.PartBytesPerToken(2, 1)
	wantErr(t, err, -1, "", "part 2 out of range [0, 2)")
	_, err = l.PartBytesPerToken(-1, 1)
	wantErr(t, err, -1, "", "part -1 out of range")
	for _, tp := range []int{0, -2} {
		_, err = l.BytesPerToken(tp)
		wantErr(t, err, -1, "", "attention-TP")
		_, err = l.PartBytesPerToken(0, tp)
		wantErr(t, err, -1, "", "attention-TP")
	}
	for _, pt := range []int{0, -1, MaxPageTokens + 1} {
		_, err = l.PageBytes(pt, 1)
		wantErr(t, err, -1, "", "tokens per page")
	}
	if b, err := l.PageBytes(MaxPageTokens, 1); err != nil || b != 2*676*MaxPageTokens {
		t.Errorf("PageBytes(MaxPageTokens) = %d, %v", b, err)
	}
	// An invalid layout has no sizes; the error is Validate's.
	bad := Layout{NumLayers: 2, Parts: []Part{{"k", 0, Sharded}}}
	_, err = bad.BytesPerToken(1)
	wantErr(t, err, 0, "k", "not positive")
	_, err = bad.PageBytes(1, 1)
	wantErr(t, err, 0, "k", "not positive")
	_, err = bad.PartBytesPerToken(0, 1)
	wantErr(t, err, 0, "k", "not positive")
}

// The largest valid layout's largest page fits an int64 exactly as Validate promises.
func TestPageBytesAtTheLimit(t *testing.T) {
	l := Layout{NumLayers: 1 << 10, Parts: []Part{{"k", 1 << 30, Replicated}, {"v", 1<<30 - 1, Replicated}}}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := l.PageBytes(MaxPageTokens, 1)
	if want := int64(1<<10) * (1<<31 - 1) * MaxPageTokens; err != nil || b != want || b <= 0 {
		t.Errorf("PageBytes = %d, %v; want %d", b, err, want)
	}
}

func TestAllReplicated(t *testing.T) {
	for _, c := range []struct {
		l    Layout
		want bool
	}{
		{Layout{NumLayers: 61, Parts: []Part{{"kv", 1152, Replicated}}}, true},
		{Layout{NumLayers: 1, Parts: []Part{{"a", 1, Replicated}, {"b", 2, Replicated}}}, true},
		{kv(32, 2048), false},
		{Layout{NumLayers: 1, Parts: []Part{{"kv", 1152, Replicated}, {"draft", 64, Sharded}}}, false},
		{Layout{NumLayers: 1}, false},
	} {
		if got := c.l.AllReplicated(); got != c.want {
			t.Errorf("%v: AllReplicated = %v, want %v", c.l, got, c.want)
		}
	}
}

func TestDiffNamesTheFirstDifference(t *testing.T) {
	base := kv(32, 2048)
	withIndexer := base.Clone()
	withIndexer.Parts = append(withIndexer.Parts, Part{"indexer", 128, Replicated})
	for _, c := range []struct {
		name string
		a, b Layout
		want string
	}{
		{"equal", base, kv(32, 2048), ""},
		{"equal empty", Layout{}, Layout{Parts: []Part{}}, ""},
		{"layer count first", kv(32, 2048), Layout{NumLayers: 61, Parts: []Part{{"kv", 1152, Replicated}}}, "layer count 32 vs 61"},
		{"bytes", base, Layout{NumLayers: 32, Parts: []Part{{"k", 2048, Sharded}, {"v", 1024, Sharded}}}, "part 1 (v): bytes per token 2048 vs 1024"},
		{"name before bytes", base, Layout{NumLayers: 32, Parts: []Part{{"k", 2048, Sharded}, {"w", 1, Sharded}}}, "part 1: name v vs w"},
		{"sharding", Layout{NumLayers: 1, Parts: []Part{{"kv", 1152, Replicated}}}, Layout{NumLayers: 1, Parts: []Part{{"kv", 1152, Sharded}}}, "part 0 (kv): sharding replicated vs sharded"},
		{"part before count", base, Layout{NumLayers: 32, Parts: []Part{{"kv", 2048, Sharded}}}, "part 0: name k vs kv"},
		{"extra part in the first", withIndexer, base, "part count 3 vs 2: part 2 (indexer) only in the first"},
		{"extra part in the second", base, withIndexer, "part count 2 vs 3: part 2 (indexer) only in the second"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.a.Diff(c.b); got != c.want {
				t.Errorf("Diff = %q, want %q", got, c.want)
			}
			if eq := c.a.Equal(c.b); eq != (c.want == "") {
				t.Errorf("Equal = %v with Diff %q", eq, c.want)
			}
			if back := c.b.Diff(c.a); (back == "") != (c.want == "") {
				t.Errorf("Diff is not symmetric in equality: %q vs %q", c.want, back)
			}
		})
	}
}

func TestCloneSharesNothing(t *testing.T) {
	a := kv(32, 2048)
	b := a.Clone()
	b.Parts[0].BytesPerToken = 1
	if a.Parts[0].BytesPerToken != 2048 {
		t.Errorf("changing the clone changed the original: %v", a)
	}
	if c := (Layout{NumLayers: 3}).Clone(); c.NumLayers != 3 || len(c.Parts) != 0 {
		t.Errorf("clone of a partless layout: %v", c)
	}
}

func TestShardingString(t *testing.T) {
	for s, want := range map[Sharding]string{Sharded: "sharded", Replicated: "replicated", 0: "sharding(0)", 9: "sharding(9)"} {
		if got := s.String(); got != want {
			t.Errorf("Sharding(%d).String() = %q, want %q", uint8(s), got, want)
		}
	}
}
