package kvlayout

import (
	"strconv"
	"strings"
)

// The textual form, for a command-line flag and a log line: ';'-separated tokens, one
// "layers=N" and per part, in order, "name=bytes:sharded" or "name=bytes:replicated", bytes
// being the part's bytes per token in decimal:
//
//	layers=32;k=2048:sharded;v=2048:sharded
//
// Parse also takes a preset's name (a text without '='). Spaces around tokens and around the
// '=' and ':' are ignored; String writes none.
const layersKey = "layers"

// String returns l in the textual form, layers first and the parts in order; Parse(l.String())
// is l for every valid layout.
func (l Layout) String() string {
	var b strings.Builder
	b.WriteString(layersKey)
	b.WriteByte('=')
	b.WriteString(strconv.Itoa(l.NumLayers))
	for _, p := range l.Parts {
		b.WriteByte(';')
		b.WriteString(p.Name)
		b.WriteByte('=')
		b.WriteString(strconv.Itoa(p.BytesPerToken))
		b.WriteByte(':')
		b.WriteString(p.Sharding.String())
	}
	return b.String()
}

// Parse returns the layout s describes: a preset's name (Preset) or the textual form. A token
// that does not parse gets a *ParseError naming it; a text whose tokens parse but whose layout
// does not validate gets Validate's *Error, naming the part; both wrap ErrBadLayout.
func Parse(s string) (Layout, error) {
	text := strings.TrimSpace(s)
	if text == "" {
		return Layout{}, &ParseError{Reason: "empty: want a preset name or layers=N;name=bytes:sharded|replicated;..."}
	}
	if !strings.Contains(text, "=") {
		return Preset(text)
	}
	var l Layout
	haveLayers := false
	for i, raw := range strings.Split(text, ";") {
		tok := strings.TrimSpace(raw)
		bad := func(reason string) (Layout, error) {
			return Layout{}, &ParseError{Position: i, Token: tok, Reason: reason}
		}
		if tok == "" {
			return bad("empty token (two ';' in a row, or one at an end)")
		}
		key, val, ok := strings.Cut(tok, "=")
		if !ok {
			return bad("want layers=N or name=bytes:sharded|replicated")
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if key == layersKey {
			if haveLayers {
				return bad("a second layers token")
			}
			n, reason := parseCount(val)
			if reason != "" {
				return bad("layer count " + reason)
			}
			l.NumLayers, haveLayers = n, true
			continue
		}
		if reason := nameProblem(key); reason != "" {
			return bad("part " + reason)
		}
		num, word, ok := strings.Cut(val, ":")
		if !ok {
			return bad("want name=bytes:sharded or name=bytes:replicated")
		}
		n, reason := parseCount(strings.TrimSpace(num))
		if reason != "" {
			return bad("bytes per token " + reason)
		}
		p := Part{Name: key, BytesPerToken: n}
		switch strings.TrimSpace(word) {
		case "sharded":
			p.Sharding = Sharded
		case "replicated":
			p.Sharding = Replicated
		default:
			return bad(strconv.Quote(strings.TrimSpace(word)) + " is neither sharded nor replicated")
		}
		l.Parts = append(l.Parts, p)
	}
	if !haveLayers {
		return Layout{}, layoutErr("no layers=N token in %q", text)
	}
	if err := l.Validate(); err != nil {
		return Layout{}, err
	}
	return l, nil
}

// parseCount parses a decimal count of at most MaxPartBytes; the reason says why not ("" if
// it parsed). Limits below that are Validate's.
func parseCount(s string) (int, string) {
	if s == "" {
		return 0, "missing"
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, strconv.Quote(s) + " is not a decimal number"
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > MaxPartBytes {
		return 0, s + " exceeds " + strconv.Itoa(MaxPartBytes)
	}
	return int(v), ""
}
