package main

import (
	"flag"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
)

// perRankFlags are the flags of `cpcache run` that may differ between the ranks of one job,
// each with why. Every other flag must be equal on every rank: the ranks compare them
// (runner.Config.StartFlags) before anything is built and refuse a difference with exit 2
// naming the flag and two ranks' values, so that a flag added later is compared unless it is
// added here.
var perRankFlags = map[string]string{
	"cuda-device":      "the rank's CUDA device ordinal",
	"store":            "how this rank reaches the rendezvous store (ranks that name different stores never meet)",
	"timeout":          "this rank's bound on the rendezvous and the final gather",
	"trace":            "the path of this rank's copy of the trace; the requests read from it are compared (their digest)",
	"storage-key-file": "the path of this rank's copy of the MAC key; the keys' fingerprints are compared when the storage opens",
	"json":             "where this rank writes the report (rank 0 writes it)",
	"html":             "where this rank writes the HTML report (rank 0 writes it)",
	"metrics":          "the address this rank serves /metrics on",
	"metrics-linger":   "how long the process that started the ranks keeps /metrics up after the run",
}

// agreedFlags are the flags of fs every rank must share (every flag but perRankFlags), each
// with its value as parsed, in fs's order (by name).
func agreedFlags(fs *flag.FlagSet) []runner.StartFlag {
	var out []runner.StartFlag
	fs.VisitAll(func(f *flag.Flag) {
		if _, own := perRankFlags[f.Name]; !own {
			out = append(out, runner.StartFlag{Flag: "--" + f.Name, Value: f.Value.String()})
		}
	})
	return out
}
