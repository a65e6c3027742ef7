package main

import "github.com/cpcache/cpcache/parallel"

// main is required by -buildmode=c-shared and c-archive; it never runs.
func main() {}

func parallelLayout(world, tp, dp, attnCP, ep int, dpAttention bool) parallel.LayoutConfig {
	return parallel.LayoutConfig{World: world, TP: tp, DP: dp, AttnCP: attnCP, EP: ep, DPAttention: dpAttention}
}
