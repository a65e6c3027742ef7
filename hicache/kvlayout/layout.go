package kvlayout

import (
	"fmt"
	"math"
)

// Sharding says how a part's bytes are spread over the attention-TP ranks of a TP group.
// The zero value is no sharding at all, so a Part whose Sharding was left out does not
// validate.
type Sharding uint8

const (
	// Sharded: each attention-TP rank holds 1/attnTP of the part's bytes of every token (K and
	// V of MHA/GQA, split by KV head).
	Sharded Sharding = 1
	// Replicated: every attention-TP rank holds all of the part's bytes (an MLA latent, an
	// indexer's keys).
	Replicated Sharding = 2
)

// String is the word Parse takes for s: "sharded" or "replicated" ("sharding(N)" for a value
// that is neither).
func (s Sharding) String() string {
	switch s {
	case Sharded:
		return "sharded"
	case Replicated:
		return "replicated"
	}
	return fmt.Sprintf("sharding(%d)", uint8(s))
}

// Limits of a valid layout. They keep every size this package computes inside int64 and make
// Decode's work proportional to its input.
const (
	MaxLayers     = 1 << 16 // layers of a layout
	MaxParts      = 256     // parts of a layer
	MaxNameLen    = 64      // bytes of a part's name
	MaxPartBytes  = 1 << 30 // bytes per token of one part (fits an int on every platform)
	MaxPageTokens = 1 << 20 // tokens of a page, for PageBytes; Validate checks page bytes at this size fit an int64
)

// Part is one buffer every layer of the model holds per token: K, V, an MLA latent, a side
// buffer. BytesPerToken counts the whole part, over all attention-TP ranks (for a sharded part,
// all KV heads).
type Part struct {
	Name          string   // unique in the layout: letters, digits, '_', '-', '.', starting with a letter; not "layers"
	BytesPerToken int      // bytes of one token of one layer, all heads
	Sharding      Sharding // how attention-TP ranks split it
}

// Layout is the shape of an engine's KV memory: NumLayers layers, each holding the same Parts
// in the same order. The order is part of the layout: it is the order of a page's chunks within
// a layer. Every rank of a cache must have an equal layout (Diff), and Fingerprint keys the
// storage namespace.
type Layout struct {
	NumLayers int
	Parts     []Part
}

// Clone returns a copy of l that shares no memory with it.
func (l Layout) Clone() Layout {
	return Layout{NumLayers: l.NumLayers, Parts: append([]Part(nil), l.Parts...)}
}

// Validate returns nil if l is a usable layout, else an *Error (wrapping ErrBadLayout) naming
// the first bad part: zero or too many layers, no parts or too many, an empty, malformed or
// duplicate part name, bytes per token <= 0 or above MaxPartBytes, a sharding that is neither Sharded nor Replicated,
// or a page of MaxPageTokens tokens whose bytes (all layers, all parts, attention-TP 1) do not
// fit an int64.
func (l Layout) Validate() error {
	switch {
	case l.NumLayers <= 0:
		return layoutErr("layer count %d is not positive", l.NumLayers)
	case l.NumLayers > MaxLayers:
		return layoutErr("layer count %d exceeds %d", l.NumLayers, MaxLayers)
	case len(l.Parts) == 0:
		return layoutErr("no parts")
	case len(l.Parts) > MaxParts:
		return layoutErr("%d parts exceed %d", len(l.Parts), MaxParts)
	}
	// sum stays at most limit, so NumLayers × sum × MaxPageTokens <= MaxInt64.
	limit := int64(math.MaxInt64) / MaxPageTokens / int64(l.NumLayers)
	var sum int64
	seen := make(map[string]int, len(l.Parts))
	for i, p := range l.Parts {
		if reason := nameProblem(p.Name); reason != "" {
			return partErr(i, p, "%s", reason)
		}
		if j, dup := seen[p.Name]; dup {
			return partErr(i, p, "duplicate name (part %d has it)", j)
		}
		seen[p.Name] = i
		if p.BytesPerToken <= 0 {
			return partErr(i, p, "bytes per token %d is not positive", p.BytesPerToken)
		}
		if p.BytesPerToken > MaxPartBytes {
			return partErr(i, p, "bytes per token %d exceed %d", p.BytesPerToken, MaxPartBytes)
		}
		if p.Sharding != Sharded && p.Sharding != Replicated {
			return partErr(i, p, "sharding %s is neither sharded nor replicated", p.Sharding)
		}
		if int64(p.BytesPerToken) > limit-sum {
			return partErr(i, p, "bytes per token %d overflows: %d layers × %d bytes per token × %d tokens per page exceed %d bytes",
				p.BytesPerToken, l.NumLayers, sum+int64(p.BytesPerToken), MaxPageTokens, int64(math.MaxInt64))
		}
		sum += int64(p.BytesPerToken)
	}
	return nil
}

// nameProblem says what is wrong with a part's name ("" if nothing). The characters are those
// the textual form can carry without quoting.
func nameProblem(name string) string {
	switch {
	case name == "":
		return "empty name"
	case len(name) > MaxNameLen:
		return fmt.Sprintf("name longer than %d bytes", MaxNameLen)
	case name == layersKey:
		return fmt.Sprintf("name %q is reserved for the layer count", layersKey)
	case !isLetter(name[0]):
		return fmt.Sprintf("name %q does not start with a letter", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isLetter(c) && !(c >= '0' && c <= '9') && c != '_' && c != '-' && c != '.' {
			return fmt.Sprintf("name %q has %q, not a letter, digit, '_', '-' or '.'", name, c)
		}
	}
	return ""
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// PartBytesPerToken returns the bytes of one token of one layer of part i on one attention-TP
// rank of attnTP: the part's bytes divided by attnTP if it is sharded, all of them if it is
// replicated. It is the token stride of that part's buffer in the engine's memory. The error
// (an *Error naming the part) says the layout does not validate, i is out of range, attnTP < 1,
// or attnTP does not divide a sharded part's bytes.
func (l Layout) PartBytesPerToken(i, attnTP int) (int, error) {
	if err := l.Validate(); err != nil {
		return 0, err
	}
	if i < 0 || i >= len(l.Parts) {
		return 0, layoutErr("part %d out of range [0, %d)", i, len(l.Parts))
	}
	if attnTP < 1 {
		return 0, layoutErr("attention-TP %d is not positive", attnTP)
	}
	return l.rankBytes(i, attnTP)
}

// rankBytes is PartBytesPerToken of a valid layout and attnTP >= 1.
func (l Layout) rankBytes(i, attnTP int) (int, error) {
	p := l.Parts[i]
	if p.Sharding == Replicated {
		return p.BytesPerToken, nil
	}
	if p.BytesPerToken%attnTP != 0 {
		return 0, partErr(i, p, "bytes per token %d are not divisible by attention-TP %d", p.BytesPerToken, attnTP)
	}
	return p.BytesPerToken / attnTP, nil
}

// BytesPerToken returns the bytes one token takes on one attention-TP rank of attnTP, over all
// layers and parts (each part as PartBytesPerToken gives it). The error is PartBytesPerToken's.
func (l Layout) BytesPerToken(attnTP int) (int64, error) {
	if err := l.Validate(); err != nil {
		return 0, err
	}
	if attnTP < 1 {
		return 0, layoutErr("attention-TP %d is not positive", attnTP)
	}
	var sum int64
	for i := range l.Parts {
		b, err := l.rankBytes(i, attnTP)
		if err != nil {
			return 0, err
		}
		sum += int64(b)
	}
	return int64(l.NumLayers) * sum, nil
}

// PageBytes returns the bytes of one page of pageTokens tokens on one attention-TP rank of
// attnTP: BytesPerToken(attnTP) × pageTokens. Validate guarantees it fits an int64 for
// pageTokens up to MaxPageTokens. The error is BytesPerToken's, or pageTokens out of
// [1, MaxPageTokens].
func (l Layout) PageBytes(pageTokens, attnTP int) (int64, error) {
	if pageTokens < 1 || pageTokens > MaxPageTokens {
		return 0, layoutErr("tokens per page %d out of [1, %d]", pageTokens, MaxPageTokens)
	}
	b, err := l.BytesPerToken(attnTP)
	if err != nil {
		return 0, err
	}
	return b * int64(pageTokens), nil
}

// AllReplicated reports whether l has parts and every one is Replicated: every attention-TP
// rank then holds the same bytes of every page (MLA), so the ranks of a TP group can share one
// L2 copy.
func (l Layout) AllReplicated() bool {
	for _, p := range l.Parts {
		if p.Sharding != Replicated {
			return false
		}
	}
	return len(l.Parts) > 0
}

// Diff returns "" if l and o are equal, else the first difference, l's value first: the layer
// count ("layer count 32 vs 61"), then part by part its name ("part 1: name v vs w"), bytes per
// token ("part 1 (v): bytes per token 2048 vs 1024") and sharding ("part 0 (kv): sharding
// replicated vs sharded"), then the part count, naming the first part only one of them has
// ("part count 3 vs 2: part 2 (indexer) only in the first").
func (l Layout) Diff(o Layout) string {
	if l.NumLayers != o.NumLayers {
		return fmt.Sprintf("layer count %d vs %d", l.NumLayers, o.NumLayers)
	}
	n := min(len(l.Parts), len(o.Parts))
	for i := range n {
		a, b := l.Parts[i], o.Parts[i]
		switch {
		case a.Name != b.Name:
			return fmt.Sprintf("part %d: name %s vs %s", i, a.Name, b.Name)
		case a.BytesPerToken != b.BytesPerToken:
			return fmt.Sprintf("part %d (%s): bytes per token %d vs %d", i, a.Name, a.BytesPerToken, b.BytesPerToken)
		case a.Sharding != b.Sharding:
			return fmt.Sprintf("part %d (%s): sharding %s vs %s", i, a.Name, a.Sharding, b.Sharding)
		}
	}
	switch {
	case len(l.Parts) > n:
		return fmt.Sprintf("part count %d vs %d: part %d (%s) only in the first", len(l.Parts), len(o.Parts), n, l.Parts[n].Name)
	case len(o.Parts) > n:
		return fmt.Sprintf("part count %d vs %d: part %d (%s) only in the second", len(l.Parts), len(o.Parts), n, o.Parts[n].Name)
	}
	return ""
}

// Equal reports whether l and o are the same layout (Diff(o) == "").
func (l Layout) Equal(o Layout) bool { return l.Diff(o) == "" }
