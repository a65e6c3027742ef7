package runner

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache"
)

func TestParseFaults(t *testing.T) {
	fs, err := ParseFaults("copy-fail:rank=3,step=200; diverge-tree:rank=5,step=400;storage-hang:after=2s,op=get+put;kill:rank=1,at=slabs;flush:step=9")
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{Kind: "copy-fail", Rank: 3, Step: 200},
		{Kind: "diverge-tree", Rank: 5, Step: 400},
		{Kind: "storage-hang", Rank: -1, After: 2 * time.Second, Ops: []string{"get", "put"}},
		{Kind: "kill", Rank: 1, At: "slabs"},
		{Kind: "flush", Rank: -1, Step: 9},
	}
	if len(fs) != len(want) {
		t.Fatalf("parsed %+v", fs)
	}
	for i := range want {
		if fs[i].Kind != want[i].Kind || fs[i].Rank != want[i].Rank || fs[i].Step != want[i].Step || fs[i].After != want[i].After ||
			strings.Join(fs[i].Ops, "+") != strings.Join(want[i].Ops, "+") || fs[i].At != want[i].At {
			t.Fatalf("fault %d: %+v, want %+v", i, fs[i], want[i])
		}
	}
	cfg := Config{Faults: fs}
	if hf := cfg.cacheFaults(3); hf == nil || hf.CopyFail != (hicache.StepFault{On: true, Step: 200}) || hf.DivergeTree.On {
		t.Fatalf("rank 3 cache faults %+v", hf)
	}
	if hf := cfg.cacheFaults(0); hf != nil {
		t.Fatalf("rank 0 cache faults %+v, want none", hf)
	}
	for spec, wantMsg := range map[string]string{
		"":                           "no fault given",
		"bogus:rank=1":               `unknown fault "bogus"`,
		"copy-fail:step=3":           "copy-fail needs rank=",
		"copy-fail:rank=x":           "rank=x: want a rank number",
		"copy-fail:rank=1,after=2s":  `copy-fail takes no parameter "after"`,
		"storage-hang:after=soon":    "after=soon: want a duration",
		"storage-error:op=scan":      `unknown operation "scan"`,
		"kill:rank=1,at=step":        "kill at=step needs step=",
		"kill:rank=1,at=never":       "at=never: want start, slabs or step",
		"flush:step=1,step=2":        `parameter "step" given twice`,
		"flush:step=1,when=later":    "when=later: want now or idle",
		"diverge-tree:rank=1;stall:": "stall needs rank=",
		"copy-fail:rank":             `parameter "rank" is not NAME=VALUE`,
	} {
		_, err := ParseFaults(spec)
		if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), wantMsg) {
			t.Errorf("ParseFaults(%q): %v, want ErrBadInput saying %q", spec, err, wantMsg)
		}
	}
}
