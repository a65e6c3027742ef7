package report

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/sim/vtime"
)

// TestTimeNonePrintsNoTTFT: under --time none every request arrived at 0, so the text report
// gives the work (prefill tokens, throughput) with the cache on and off and no TTFT or queue
// figure; in virtual time it gives both rows of TTFT and the TTFT saved.
func TestTimeNonePrintsNoTTFT(t *testing.T) {
	figs := func(prefill int64, ttft float64) LatencyFigures {
		return LatencyFigures{TTFTP50Ms: ttft, TTFTP90Ms: ttft, TTFTP99Ms: ttft, QueueP50Ms: ttft, PrefillTokens: prefill, MakespanS: 2}
	}
	text := func(mode string) string {
		r := &Report{InputTokens: 1000, Latency: &LatencyReport{Time: mode, Speed: 1, On: figs(400, 100), Off: figs(1000, 300), TTFTSavedP50Ms: 200}}
		var b strings.Builder
		r.writeTimeText(&b)
		return b.String()
	}
	none := text(vtime.None)
	assert.NotContains(t, none, "TTFT p50")
	assert.NotContains(t, none, "TTFT saved")
	assert.NotContains(t, none, "queue p50")
	assert.Contains(t, none, "400 prefill tokens")
	assert.Contains(t, none, "1000 prefill tokens")
	assert.Contains(t, none, "prefill tokens saved 60.0%")
	virtual := text(vtime.Virtual)
	assert.Contains(t, virtual, "TTFT p50 100.0 ms")
	assert.Contains(t, virtual, "TTFT saved           per request (off minus on): p50 200.0 ms")
}

// TestTTFTSavedIsPerRequest: "TTFT saved" is the quantiles of each request's own saving (its
// cache-off TTFT minus its cache-on TTFT, matched by request ID whatever the admission order),
// not the difference of the two runs' quantiles. Ten requests with cache-off TTFTs 100..1000 ms,
// of which only the slowest (1000 ms) is served in 100 ms with the cache: the quantiles of the
// savings are p50 0, p90 0, p99 900 ms; differences of the quantiles would give 100 ms at each.
func TestTTFTSavedIsPerRequest(t *testing.T) {
	const ms = int64(1e6)
	var on, off ReplicaTiming
	for id := range int32(10) {
		ttft := int64(id+1) * 100 * ms
		off.Requests = append(off.Requests, vtime.RequestTiming{ID: id, TTFTNs: ttft})
		if id == 9 {
			ttft = 100 * ms
		}
		// With the cache the requests were admitted in the reverse order.
		on.Requests = append([]vtime.RequestTiming{{ID: id, TTFTNs: ttft}}, on.Requests...)
	}
	saved := TTFTSaved([]ReplicaTiming{on}, []ReplicaTiming{off})
	require.Len(t, saved, 10, "one saving per request")
	assert.Equal(t, []float64{0, 0, 900}, []float64{QuantileMs(saved, 0.5), QuantileMs(saved, 0.9), QuantileMs(saved, 0.99)})

	fOn, fOff := Figures([]ReplicaTiming{on}, 0), Figures([]ReplicaTiming{off}, 0)
	assert.Equal(t, []float64{100, 100, 100}, []float64{fOff.TTFTP50Ms - fOn.TTFTP50Ms, fOff.TTFTP90Ms - fOn.TTFTP90Ms, fOff.TTFTP99Ms - fOn.TTFTP99Ms},
		"the differences of quantiles, which the report does not give")

	r := &Report{InputTokens: 1000, Latency: &LatencyReport{Time: vtime.Virtual, Speed: 1, On: fOn, Off: fOff,
		TTFTSavedP50Ms: QuantileMs(saved, 0.5), TTFTSavedP90Ms: QuantileMs(saved, 0.9), TTFTSavedP99Ms: QuantileMs(saved, 0.99)}}
	var b strings.Builder
	r.writeTimeText(&b)
	assert.Contains(t, b.String(), "TTFT saved           per request (off minus on): p50 0.0 ms, p90 0.0 ms, p99 900.0 ms;")

	// Two replicas: each replica's requests are matched with that replica's cache-off run only
	// (IDs repeat across replicas' request lists only by chance of the workload split).
	other := ReplicaTiming{Requests: []vtime.RequestTiming{{ID: 0, TTFTNs: 50 * ms}}}
	otherOff := ReplicaTiming{Requests: []vtime.RequestTiming{{ID: 0, TTFTNs: 80 * ms}}}
	saved = TTFTSaved([]ReplicaTiming{on, other}, []ReplicaTiming{off, otherOff})
	require.Len(t, saved, 11)
	assert.Equal(t, 30*ms, saved[9], "replica 1's request 0 saved 80 - 50 ms, not 100 - 50")
}
