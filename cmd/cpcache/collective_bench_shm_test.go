package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestCollectiveBenchBothBackendsPrintsRatios(t *testing.T) {
	out := launchBench(t, "--world 4 --dp 2 --attn-cp 2 --dp-attention --iters 20 --warmup 2 --backend both")
	rows := map[string]int{} // "backend group op" -> count, from rank 0's table
	ratios := map[string]int{}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(strings.TrimPrefix(line, "[0] "))
		if !strings.HasPrefix(line, "[0] ") || len(f) < 3 {
			continue
		}
		switch {
		case (f[0] == "gloo" || f[0] == "shm") && len(f) == 5:
			rows[f[0]+" "+f[1]+" "+f[2]]++
		case len(f) == 3 && strings.HasSuffix(f[2], "x"):
			ratios[f[0]+" "+f[1]]++
		}
	}
	for _, g := range []string{"world[0..3]", "attn_cp[0,1]", "attn_cp[2,3]"} {
		for _, op := range benchOps {
			for _, b := range []string{"gloo", "shm"} {
				if rows[b+" "+g+" "+op.name] != 1 {
					t.Errorf("%s %s %s: %d rows, want 1", b, g, op.name, rows[b+" "+g+" "+op.name])
				}
			}
			if ratios[g+" "+op.name] != 1 {
				t.Errorf("%s %s: %d ratio lines, want 1", g, op.name, ratios[g+" "+op.name])
			}
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}

func TestExpandBackends(t *testing.T) {
	for in, want := range map[string][]string{
		"gloo": {"gloo"}, "shm": {"shm"}, "both": {"gloo", "shm"}, "shm,gloo": {"shm", "gloo"},
	} {
		if got := expandBackends(in); !reflect.DeepEqual(got, want) {
			t.Errorf("expandBackends(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPrintBackendRatios(t *testing.T) {
	var b bytes.Buffer
	printBackendRatios(&b, []benchResult{
		{Backend: "gloo", Group: "g", Op: "barrier", MedianUS: 300},
		{Backend: "shm", Group: "g", Op: "barrier", MedianUS: 10},
		{Backend: "shm", Group: "g", Op: "allgather_64B", MedianUS: 10}, // no gloo twin: no line
	})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "30.0x") || strings.Contains(b.String(), "allgather") {
		t.Errorf("ratios:\n%s", b.String())
	}
	b.Reset()
	printBackendRatios(&b, []benchResult{{Backend: "gloo", Group: "g", Op: "barrier", MedianUS: 300}})
	if b.Len() != 0 {
		t.Errorf("ratios printed without shm results:\n%s", b.String())
	}
}
