package workload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTraceLimitsRefuseHostileLinesQuickly: every limit is enforced on its line, before the
// line's tokens exist, with an error naming the line and the limit, in well under a second.
func TestTraceLimitsRefuseHostileLinesQuickly(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}` + "\n"
	ids := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprint(&b, i)
		}
		return b.String()
	}
	for _, c := range []struct{ name, line, want string }{
		{"output_length max int", `{"timestamp": 0, "input_length": 600, "output_length": 9223372036854775807, "hash_ids": [1, 2]}`, "output_length 9223372036854775807 is over the limit of 1048576"},
		{"input_length 512e6", `{"timestamp": 0, "input_length": 512000000, "output_length": 1, "hash_ids": [1]}`, "input_length 512000000 is over the limit of 2097152"},
		{"too many hash_ids", `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [` + ids(5000) + `]}`, "5000 hash_ids are over the limit of 4096"},
		{"line too long", `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [` + ids(200000) + `]}`, "line 2 is longer than 1048576 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := ReadTrace(strings.NewReader(good+c.line+"\n"+good), TraceOptions{})
			if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "line 2") {
				t.Fatalf("error %v, want ErrBadTrace naming line 2 and %q", err, c.want)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("took %v to refuse the line", d)
			}
		})
	}
}

func TestWorkloadTokenLimit(t *testing.T) {
	// Five lines of 600 tokens pass every per-line limit; with a limit of 2000 tokens the
	// trace is refused at line 4, where the total passes it.
	line := `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}` + "\n"
	_, err := ReadTrace(strings.NewReader(strings.Repeat(line, 5)), TraceOptions{MaxTokens: 2000})
	if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), "over 2000 prompt tokens") {
		t.Fatalf("error %v, want ErrBadTrace naming line 4 and the limit", err)
	}
	reqs, err := ReadTrace(strings.NewReader(strings.Repeat(line, 5)), TraceOptions{MaxTokens: 2000, MaxRequests: 3})
	if err != nil || len(reqs) != 3 {
		t.Fatalf("3 requests under the limit: %d requests, %v", len(reqs), err)
	}
}

func TestSyntheticLimits(t *testing.T) {
	for _, c := range []struct {
		cfg  SyntheticConfig
		want string
	}{
		{SyntheticConfig{Clients: 1 << 30, Rounds: 1, QuestionTokens: 1}, "clients 1073741824 is over the limit"},
		{SyntheticConfig{Clients: 1, Rounds: 1 << 30, QuestionTokens: 1}, "rounds 1073741824 is over the limit"},
		{SyntheticConfig{Clients: 1, Rounds: 1, QuestionTokens: 1 << 40}, "over the limit of 2097152 input"},
		{SyntheticConfig{Clients: 1, Rounds: 60000, QuestionTokens: 1000}, "longer than 16M tokens"},
		{SyntheticConfig{Clients: 100000, Rounds: 16, QuestionTokens: 384, AnswerTokens: 64}, "over the limit of 268435456"},
	} {
		start := time.Now()
		if _, err := Synthetic(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", c.cfg, err, c.want)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("%+v: refused after %v, before generating anything it should be immediate", c.cfg, d)
		}
	}
}

// TestTraceLineErrorsNameTheValue: a field of the wrong type or out of range is refused
// with an error naming the file, the line, the field and the value as written (a
// whole-line JSON decode said only "cannot unmarshal string into Go struct field").
func TestTraceLineErrorsNameTheValue(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}`
	for _, c := range []struct{ line, want string }{
		{`{"timestamp": 0, "input_length": "600", "output_length": 1, "hash_ids": [1, 2]}`, `invalid JSON: input_length "600" is not a 64-bit integer`},
		{`{"timestamp": 0, "input_length": 600, "output_length": 99999999999999999999, "hash_ids": [1, 2]}`, `invalid JSON: output_length 99999999999999999999 is not a 64-bit integer`},
		{`{"timestamp": 1.5, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`, `invalid JSON: timestamp 1.5 is not a 64-bit integer`},
		{`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, -2]}`, `invalid JSON: hash_ids[1] -2 is not an unsigned 64-bit integer`},
		{`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, "b"]}`, `invalid JSON: hash_ids[1] "b" is not an unsigned 64-bit integer`},
		{`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": "1,2"}`, `invalid JSON: hash_ids "1,2" is not an array`},
		{`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": null}`, `missing or empty "hash_ids"`},
		{`{"timestamp": 0, "input_length": 600, "output_length": 1}`, `missing or empty "hash_ids"`},
		{`{"timestamp": 0, "input_length": -600, "output_length": 1, "hash_ids": [1, 2]}`, `input_length -600 must be positive`},
	} {
		path := filepath.Join(t.TempDir(), "trace.jsonl")
		if err := os.WriteFile(path, []byte(good+"\n"+c.line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ReadTraceFile(path, TraceOptions{})
		if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), path+": line 2: "+c.want) {
			t.Errorf("%s:\n  error %v\n  want ErrBadTrace with %q", c.line, err, path+": line 2: "+c.want)
		}
	}
}
