package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/cpcache/cpcache/parallel"
)

func init() {
	register(command{name: "layout", summary: "print the process groups of a parallel layout", run: runLayout})
}

func runLayout(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("layout", "[--world N --tp N --dp N --attn-cp N --ep N --dp-attention=BOOL] [--json]",
		"Prints every group of the layout as global rank lists: tp, attn_tp, attn_cp, ep,\n"+
			"replica (attention-DP blocks: the ranks that run the cache's consensus) and slab\n"+
			"(the ranks that share L2 slabs).", stderr)
	cfg := layoutFlags(fs, defaultLayoutFlags)
	asJSON := fs.Bool("json", false, "print JSON: one key per kind, each a sorted list of rank lists")
	if status, done := parseFlags(fs, args); done {
		return status
	}
	if fs.NArg() > 0 {
		return fail(stderr, 2, fmt.Errorf("layout: unexpected argument %q", fs.Arg(0)))
	}
	if cfg.World == 0 {
		return fail(stderr, 2, fmt.Errorf("layout: --world is required"))
	}
	l, err := parallel.NewLayout(*cfg)
	if err != nil {
		return fail(stderr, 2, err)
	}
	if *asJSON {
		out := map[string][][]int{}
		for _, k := range parallel.AllKinds {
			out[k.String()] = l.Groups(k)
		}
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(out); err != nil {
			return fail(stderr, 1, err)
		}
		return 0
	}
	fmt.Fprintf(stdout, "layout: %s\n", l)
	for _, k := range parallel.AllKinds {
		gs := l.Groups(k)
		fmt.Fprintf(stdout, "%-8s %d group(s) of %d:", k, len(gs), len(gs[0]))
		for _, g := range gs {
			fmt.Fprintf(stdout, " %s", parallel.GroupName("", g))
		}
		fmt.Fprintln(stdout)
	}
	return 0
}
