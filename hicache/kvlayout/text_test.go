package kvlayout

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAccepts(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // String of the result
	}{
		{"layers=32;k=2048:sharded;v=2048:sharded", "layers=32;k=2048:sharded;v=2048:sharded"},
		{"  layers = 61 ; kv = 1152 : replicated  ", "layers=61;kv=1152:replicated"},
		{"k=2048:sharded;layers=32;v=2048:sharded", "layers=32;k=2048:sharded;v=2048:sharded"},
		{"layers=0032;k=0100:sharded", "layers=32;k=100:sharded"},
		{"layers=1;draft.k=64:sharded;draft.v=64:sharded;idx_1=132:replicated", "layers=1;draft.k=64:sharded;draft.v=64:sharded;idx_1=132:replicated"},
		{"llama-3-8b", "layers=32;k=2048:sharded;v=2048:sharded"},
		{" deepseek-v3 ", "layers=61;kv=1152:replicated"},
		{"llama-3-8b-indexer", "layers=32;k=2048:sharded;v=2048:sharded;indexer=128:replicated"},
	} {
		l, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if got := l.String(); got != c.want {
			t.Errorf("Parse(%q).String() = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseNamesTheBadToken(t *testing.T) {
	for _, c := range []struct {
		in       string
		position int
		token    string
		reason   string
	}{
		{"", 0, "", "empty: want a preset name"},
		{"   ", 0, "", "empty"},
		{"layers=32;;k=1:sharded", 1, "", "empty token"},
		{"layers=32;k=1:sharded;", 2, "", "empty token"},
		{"layers=32;k:sharded", 1, "k:sharded", "want layers=N or name=bytes"},
		{"layers=32;k=2048", 1, "k=2048", "want name=bytes:sharded or name=bytes:replicated"},
		{"layers=32;k=2048:split", 1, "k=2048:split", `"split" is neither sharded nor replicated`},
		{"layers=32;k=2048:Sharded", 1, "k=2048:Sharded", `"Sharded" is neither`},
		{"layers=32;k=2048:", 1, "k=2048:", `"" is neither`},
		{"layers=32;k=-1:sharded", 1, "k=-1:sharded", `bytes per token "-1" is not a decimal number`},
		{"layers=32;k=+1:sharded", 1, "k=+1:sharded", `"+1" is not a decimal number`},
		{"layers=32;k=0x10:sharded", 1, "k=0x10:sharded", `"0x10" is not a decimal number`},
		{"layers=32;k=:sharded", 1, "k=:sharded", "bytes per token missing"},
		{"layers=32;k=1073741825:sharded", 1, "k=1073741825:sharded", "exceeds 1073741824"},
		{"layers=32;k=99999999999999999999999:sharded", 1, "k=99999999999999999999999:sharded", "exceeds"},
		{"layers=x;k=1:sharded", 0, "layers=x", `layer count "x" is not a decimal number`},
		{"layers=;k=1:sharded", 0, "layers=", "layer count missing"},
		{"layers=32;k=1:sharded;layers=32", 2, "layers=32", "a second layers token"},
		{"layers=32;=1:sharded", 1, "=1:sharded", "part empty name"},
		{"layers=32;1k=1:sharded", 1, "1k=1:sharded", "does not start with a letter"},
		{"layers=32;k/v=1:sharded", 1, "k/v=1:sharded", "'/'"},
		{"layers=32 ; k v=1:sharded", 1, "k v=1:sharded", "' '"},
	} {
		_, err := Parse(c.in)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("Parse(%q) = %v (%T), want a *ParseError", c.in, err, err)
			continue
		}
		if !errors.Is(err, ErrBadLayout) {
			t.Errorf("Parse(%q): %v does not wrap ErrBadLayout", c.in, err)
		}
		if pe.Position != c.position || pe.Token != c.token || !strings.Contains(pe.Error(), c.reason) {
			t.Errorf("Parse(%q) = %q (token %d %q), want token %d %q, containing %q", c.in, pe, pe.Position, pe.Token, c.position, c.token, c.reason)
		}
		if c.token != "" && !strings.Contains(pe.Error(), c.token) {
			t.Errorf("Parse(%q): %q does not quote the token", c.in, pe)
		}
	}
}

// A text whose tokens parse but whose layout is not valid gets Validate's error, naming the
// part.
func TestParseValidates(t *testing.T) {
	for _, c := range []struct {
		in     string
		index  int
		part   string
		reason string
	}{
		{"k=1:sharded", -1, "", `no layers=N token in "k=1:sharded"`},
		{"layers=32", -1, "", "no parts"},
		{"layers=0;k=1:sharded", -1, "", "layer count 0 is not positive"},
		{"layers=70000;k=1:sharded", -1, "", "exceeds 65536"},
		{"layers=32;k=1:sharded;v=0:sharded", 1, "v", "bytes per token 0 is not positive"},
		{"layers=32;k=1:sharded;v=1:sharded;k=2:replicated", 2, "k", "duplicate name (part 0 has it)"},
	} {
		_, err := Parse(c.in)
		wantErr(t, err, c.index, c.part, c.reason)
	}
}

func TestStringOfInvalidLayouts(t *testing.T) {
	l := Layout{NumLayers: -1, Parts: []Part{{"k", 0, 0}}}
	if got, want := l.String(), "layers=-1;k=0:sharding(0)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if got := (Layout{}).String(); got != "layers=0" {
		t.Errorf("String of the zero layout = %q", got)
	}
}
