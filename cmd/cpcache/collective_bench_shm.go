package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/shm"
)

// The shared-memory backend of collective-bench: parallel/shm groups built over the Gloo world
// and attention-CP groups (so every rank must be on this host, as under `cpcache launch`).
// "--backend both" measures gloo then shm in one run and prints the ratio of the medians.
func init() { benchBackends["shm"] = shmBenchGroups }

func shmBenchGroups(ctx context.Context, l *parallel.Layout, store string, timeout time.Duration) (*benchGroups, error) {
	boot, err := glooBenchGroups(ctx, l, store, timeout)
	if err != nil {
		return nil, err
	}
	opts := shm.Options{Timeout: timeout}
	w, err := shm.New(ctx, boot.World, opts)
	if err != nil {
		boot.Close()
		return nil, err
	}
	cp, err := shm.New(ctx, boot.CP, opts)
	if err != nil {
		w.Close()
		boot.Close()
		return nil, err
	}
	return &benchGroups{World: w, CP: cp, Close: func() error {
		cp.Close()
		w.Close()
		return boot.Close()
	}}, nil
}

// expandBackends splits the --backend list; "both" stands for gloo,shm.
func expandBackends(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b == "both" {
			out = append(out, "gloo", "shm")
			continue
		}
		out = append(out, b)
	}
	return out
}

// printBackendRatios prints, for every (group, op) measured on both gloo and shm, the ratio
// of the gloo median to the shm median.
func printBackendRatios(w io.Writer, results []benchResult) {
	gloo := map[string]benchResult{}
	for _, r := range results {
		if r.Backend == "gloo" {
			gloo[r.Group+"/"+r.Op] = r
		}
	}
	header := false
	for _, r := range results {
		g, ok := gloo[r.Group+"/"+r.Op]
		if r.Backend != "shm" || !ok || r.MedianUS <= 0 {
			continue
		}
		if !header {
			fmt.Fprintf(w, "%-29s %-22s %12s\n", "gloo/shm median ratio", "op", "ratio")
			header = true
		}
		fmt.Fprintf(w, "%-29s %-22s %11.1fx\n", r.Group, r.Op, g.MedianUS/r.MedianUS)
	}
}
