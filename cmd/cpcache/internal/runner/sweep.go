package runner

import (
	"encoding/json"
	"fmt"
	"github.com/cpcache/cpcache/sim/vtime"
	"io"
	"slices"
	"strings"
)

// SweepParams are the parameters --sweep accepts (each also a `cpcache run` flag).
var SweepParams = []string{"l2-pages", "l1-pages", "policy", "prefetch-policy"}

// ParseSweep parses a --sweep value, "param=v1,v2,...", e.g. "l2-pages=1024,4096,16384".
// The values are checked when each run's flags are parsed. Errors wrap ErrBadInput.
func ParseSweep(s string) (param string, values []string, err error) {
	param, list, ok := strings.Cut(s, "=")
	if !ok || !slices.Contains(SweepParams, param) {
		return "", nil, bad("sweep %q: want PARAM=V1,V2,... with PARAM one of %s", s, strings.Join(SweepParams, ", "))
	}
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			return "", nil, bad("sweep %q: an empty value", s)
		}
		values = append(values, v)
	}
	return param, values, nil
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
