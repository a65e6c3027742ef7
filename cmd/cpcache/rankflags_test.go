package main

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
)

// TestRunFlagsAreComparedUnlessPerRank: every flag of `cpcache run` is either one the ranks
// compare before anything is built (agreedFlags, which the runner compares with what it makes
// of the flags it knows) or one of perRankFlags, never both, and perRankFlags names only
// flags that exist: a flag added later is compared unless someone adds it to perRankFlags.
// A value given to any compared flag shows in what the ranks compare, named by the flag.
func TestRunFlagsAreComparedUnlessPerRank(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runFlags(fs)
	base := agreedFlags(fs)
	compared := map[string]string{}
	for _, f := range base {
		compared[f.Flag] = f.Value
	}
	for name := range perRankFlags {
		if fs.Lookup(name) == nil {
			t.Errorf("perRankFlags names --%s, which `cpcache run` does not have", name)
		}
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		_, own := perRankFlags[f.Name]
		_, agreed := compared["--"+f.Name]
		if own == agreed {
			t.Errorf("--%s: per-rank %v, compared %v: want exactly one", f.Name, own, agreed)
		}
	})
	if len(base) != n-len(perRankFlags) {
		t.Errorf("%d flags compared, %d per-rank, of %d", len(base), len(perRankFlags), n)
	}
	// Each compared flag given another value on one rank differs in what that rank compares.
	for _, f := range base {
		name := f.Flag[2:]
		other := flag.NewFlagSet("run", flag.ContinueOnError)
		other.SetOutput(io.Discard)
		runFlags(other)
		set := false
		for _, v := range []string{"true", "false", "7", "3s", "0.5", "per-client", "x"} {
			if other.Set(name, v) == nil && other.Lookup(name).Value.String() != f.Value {
				set = true
				break
			}
		}
		if !set {
			t.Errorf("%s: no other value to try", f.Flag)
			continue
		}
		i := slices.IndexFunc(agreedFlags(other), func(g runner.StartFlag) bool { return g.Flag == f.Flag })
		if i < 0 || agreedFlags(other)[i].Value == f.Value {
			t.Errorf("%s given another value: not told apart from %q", f.Flag, f.Value)
		}
	}
	for _, must := range []string{"--isolation", "--kv-events", "--kv-events-replay", "--storage-insecure", "--turn-gap"} {
		if _, ok := compared[must]; !ok {
			t.Errorf("%s is not compared", must)
		}
	}
}
