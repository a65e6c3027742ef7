package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/cpcache/cpcache/parallel"
)

// newFlagSet returns a FlagSet that reports to stderr and prints usage with a description.
func newFlagSet(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: cpcache %s %s\n\n%s\n\nFlags:\n", name, synopsis, description)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args; it returns (exit status, done): done when help was printed or the
// flags were bad. A bad flag is one line that points to --help, not the whole usage.
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if err == nil {
		return 0, false
	}
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return 0, true
	}
	fmt.Fprintf(out, "cpcache: %s: %v (see cpcache %s --help)\n", fs.Name(), err, fs.Name())
	return 2, true
}

// defaultLayoutFlags are the layout flags' defaults of layout and collective-bench; run's
// default job (runner.DefaultConfig) agrees on DP attention. DP attention is on because a
// layout with dp > 1 needs it (parallel.NewLayout refuses dp > 1 without), and with dp 1
// it changes nothing.
var defaultLayoutFlags = parallel.LayoutConfig{DPAttention: true}

// layoutFlags registers the parallel-layout flags shared by every multi-rank command.
func layoutFlags(fs *flag.FlagSet, defaults parallel.LayoutConfig) *parallel.LayoutConfig {
	cfg := defaults
	fs.IntVar(&cfg.World, "world", defaults.World, "number of ranks")
	fs.IntVar(&cfg.TP, "tp", defaults.TP, "tensor-parallel size (0: world)")
	fs.IntVar(&cfg.DP, "dp", defaults.DP, "data-parallel size (0: 1)")
	fs.IntVar(&cfg.AttnCP, "attn-cp", defaults.AttnCP, "attention context-parallel size (0: 1)")
	fs.IntVar(&cfg.EP, "ep", defaults.EP, "expert-parallel size (0: 1)")
	fs.BoolVar(&cfg.DPAttention, "dp-attention", defaults.DPAttention, "DP attention: each DP replica runs attention on its own ranks (needed for --dp > 1; --dp-attention=false to turn it off)")
	return &cfg
}

// fail prints a one-line error and returns status.
func fail(stderr io.Writer, status int, err error) int {
	fmt.Fprintf(stderr, "cpcache: %v\n", err)
	return status
}
