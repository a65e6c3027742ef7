package report

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/cpcache/cpcache/sim/vtime"
)

// SweepResult is a sweep: one report per value of one parameter.
type SweepResult struct {
	Param   string    `json:"param"`
	Values  []string  `json:"values"`
	Reports []*Report `json:"reports"`
}

// WriteSweepTable writes one line per value: the hit rate per tier and overall beside the
// reference hit rates (LRU of 512-token blocks of the same capacity, unlimited), TTFT
// p50/p99 in virtual time and the bytes moved between L1 and L2.
func WriteSweepTable(w io.Writer, sw *SweepResult) {
	fmt.Fprintf(w, "%-16s %8s %8s %8s %8s %8s %10s %10s %10s %10s %11s\n",
		sw.Param, "L1 hit", "L2 hit", "L3 hit", "hit", "LRU-512", "unlimited", "TTFT p50", "TTFT p99", "saved p50", "bytes moved")
	for i, r := range sw.Reports {
		var p50, p99, saved string = "-", "-", "-"
		if l := r.Latency; l != nil {
			p50, p99 = fmt.Sprintf("%.1f ms", l.On.TTFTP50Ms), fmt.Sprintf("%.1f ms", l.On.TTFTP99Ms)
			saved = fmt.Sprintf("%.1f ms", l.TTFTSavedP50Ms)
		}
		fmt.Fprintf(w, "%-16s %8s %8s %8s %7.1f%% %7.1f%% %9.1f%% %10s %10s %10s %11s\n",
			sw.Values[i], r.pct(r.TokensHitL1), r.pct(r.TokensHitL2), r.pct(r.TokensHitL3), 100*r.HitRate,
			100*r.Reference.LRUBlockHitRate, 100*r.Reference.ReuseBoundHitRate, p50, p99, saved, vtime.HumanBytes(r.BytesMoved))
	}
}

// WriteSweepJSON writes the sweep (every run's report) as indented JSON.
func WriteSweepJSON(w io.Writer, sw *SweepResult) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(sw)
}
