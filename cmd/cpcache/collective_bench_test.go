package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

const benchHelperEnv = "CPCACHE_COLLECTIVE_BENCH_HELPER_ARGS"

// TestCollectiveBenchHelper is not a test: it is the rank process that
// TestCollectiveBenchUnderLaunch starts through `launch` (the test binary re-executed).
func TestCollectiveBenchHelper(t *testing.T) {
	args := os.Getenv(benchHelperEnv)
	if args == "" {
		t.Skip("helper process for TestCollectiveBenchUnderLaunch")
	}
	os.Exit(runCollectiveBench(strings.Fields(args), os.Stdout, os.Stderr))
}

// launchBench runs `collective-bench <flags>` on 4 ranks under `launch` (each rank is this
// test binary running TestCollectiveBenchHelper) and returns the merged, rank-prefixed stdout.
func launchBench(t *testing.T, flags string) *syncBuffer {
	t.Helper()
	var out, errOut syncBuffer
	t.Setenv(benchHelperEnv, flags)
	st := runLaunch([]string{"-n", "4", "--", os.Args[0], "-test.run=^TestCollectiveBenchHelper$"}, &out, &errOut)
	if st != 0 {
		t.Fatalf("status %d\nstdout:\n%s\nstderr:\n%s", st, out.String(), errOut.String())
	}
	return &out
}

func TestCollectiveBenchUnderLaunch(t *testing.T) {
	out := launchBench(t, "--world 4 --dp 2 --attn-cp 2 --dp-attention --iters 20 --warmup 2 --json")
	var rep benchReport
	found := false
	for _, line := range strings.Split(out.String(), "\n") {
		if js, ok := strings.CutPrefix(line, "[0] {"); ok {
			if err := json.Unmarshal([]byte("{"+js), &rep); err != nil {
				t.Fatalf("rank 0's JSON: %v\n%s", err, line)
			}
			found = true
		} else if strings.HasPrefix(line, "[") && !strings.HasPrefix(line, "[0]") && strings.Contains(line, "{") {
			t.Errorf("a rank other than 0 printed results: %s", line)
		}
	}
	if !found {
		t.Fatalf("no JSON from rank 0 in:\n%s", out.String())
	}
	want := map[string]int{}
	for _, g := range []string{"world[0..3]", "attn_cp[0,1]", "attn_cp[2,3]"} {
		for _, op := range benchOps {
			want[g+" "+op.name] = 0
		}
	}
	for _, r := range rep.Results {
		key := r.Group + " " + r.Op
		if _, ok := want[key]; !ok {
			t.Errorf("unexpected result %s", key)
			continue
		}
		want[key]++
		if r.Backend != "gloo" || r.MedianUS <= 0 || r.P99US < r.MedianUS {
			t.Errorf("%s: implausible result %+v", key, r)
		}
	}
	for k, n := range want {
		if n != 1 {
			t.Errorf("%s reported %d times, want once", k, n)
		}
	}
	if rep.Iters != 20 || !strings.Contains(rep.Layout, "attn_cp=2") {
		t.Errorf("report header %q iters %d does not match the flags", rep.Layout, rep.Iters)
	}
}

func TestCollectiveBenchUsage(t *testing.T) {
	for _, args := range [][]string{{"--iters", "0"}, {"--backend", "nope"}, {"extra"}, {"--world", "3"}} {
		var out, errOut syncBuffer
		if st := runCollectiveBench(args, &out, &errOut); st != 2 {
			t.Errorf("collective-bench %q: status %d, want 2 (stderr %s)", args, st, errOut.String())
		} else if !strings.Contains(errOut.String(), "cpcache") {
			t.Errorf("collective-bench %q: no error message", args)
		}
	}
}

// TestCollectiveBenchRefusesATimeoutThatIsNotPositive: under a launcher, --timeout -1s was
// passed on and the groups silently took their default deadline instead.
func TestCollectiveBenchRefusesATimeoutThatIsNotPositive(t *testing.T) {
	for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"} {
		t.Setenv(k, v)
	}
	for _, timeout := range []string{"-1s", "0s"} {
		var out, errOut syncBuffer
		st := runCollectiveBench([]string{"--timeout", timeout}, &out, &errOut)
		if st != 2 || !strings.Contains(errOut.String(), "--timeout "+timeout+" must be positive") {
			t.Errorf("--timeout %s: status %d, stderr %q; want 2 naming the value", timeout, st, errOut.String())
		}
	}
}
