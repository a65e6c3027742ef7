package report

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/cpcache/cpcache/sim/vtime"
)

// ReplicaTiming is what one replica measured of virtual time and misses: its requests' timings,
// its makespan and computed prompt tokens, and its miss causes.
type ReplicaTiming struct {
	Requests       []vtime.RequestTiming `json:"requests"`
	MakespanNs     float64               `json:"makespan_ns"`
	ComputedTokens int64                 `json:"computed_tokens"`
	Misses         MissCauses            `json:"misses"`
}

// TTFTSaved is, sorted, every request's TTFT saved: its cache-off TTFT minus its cache-on
// TTFT (on[i] and off[i] are one replica's runs of the same requests, matched by ID; a
// request is counted once, by its last prefill). Quantiles of these savings are what a
// request gains; a difference of the two runs' quantiles is not (it compares different
// requests, and its p99 can be below its p90).
func TTFTSaved(on, off []ReplicaTiming) []int64 {
	var saved []int64
	for i := range min(len(on), len(off)) {
		offTTFT := make(map[int32]int64, len(off[i].Requests))
		for _, t := range off[i].Requests {
			offTTFT[t.ID] = t.TTFTNs
		}
		onTTFT := make(map[int32]int64, len(on[i].Requests))
		for _, t := range on[i].Requests {
			onTTFT[t.ID] = t.TTFTNs
		}
		for id, ttft := range onTTFT {
			if o, ok := offTTFT[id]; ok {
				saved = append(saved, o-ttft)
			}
		}
	}
	slices.Sort(saved)
	return saved
}

// Time is how a run modelled time, for its latency report.
type Time struct {
	Mode         string // vtime.Virtual or vtime.None
	Speed        float64
	Cost         vtime.CostProfile
	Model        vtime.CostModel
	PrefetchSync bool // the run waited for prefetches in steps where nothing decodes
	Storage      bool // the run had an L3 storage tier
}

// TimingOf is what clock measured (its timings, makespan and computed tokens), without
// miss causes.
func TimingOf(v *vtime.Clock) ReplicaTiming {
	return ReplicaTiming{Requests: v.Timings(), MakespanNs: v.MakespanNs(), ComputedTokens: v.Computed()}
}

// AddTiming adds what virtual time and the miss attribution measured to r: the latency
// figures with the cache on (on: each replica's measured timing) and off (off: the same
// replicas simulated with the cache off, in the same order), the hit-rate timeline, the
// miss causes, the consensus-latency histogram of the sorted latencies lat and the
// reference hit counts ref of the workload.
func (r *Report) AddTiming(t Time, on, off []ReplicaTiming, lat []time.Duration, ref Reference) {
	for _, x := range on {
		r.MissCauses.Add(x.Misses)
	}
	saved := TTFTSaved(on, off)
	be := t.Model.BreakEven()
	r.Latency = &LatencyReport{Time: t.Mode, Speed: t.Speed, CostProfile: t.Cost, Model: t.Model, BreakEven: be,
		PrefetchSync: t.PrefetchSync && t.Storage, On: Figures(on, r.OutputTokens), Off: Figures(off, r.OutputTokens),
		TTFTSavedP50Ms: QuantileMs(saved, 0.5), TTFTSavedP90Ms: QuantileMs(saved, 0.9), TTFTSavedP99Ms: QuantileMs(saved, 0.99)}
	if t.Storage {
		r.Latency.Warning = be.Warning(t.Cost.Name)
	}
	r.Timeline = Timeline(on)
	r.ConsensusHistogram = Histogram(lat)
	r.Reference = ref
}

// LatencyFigures are the latency and throughput of a run in virtual time.
type LatencyFigures struct {
	TTFTP50Ms     float64 `json:"ttft_p50_ms"`
	TTFTP90Ms     float64 `json:"ttft_p90_ms"`
	TTFTP99Ms     float64 `json:"ttft_p99_ms"`
	QueueP50Ms    float64 `json:"queue_p50_ms"`
	QueueP99Ms    float64 `json:"queue_p99_ms"`
	QueueMeanMs   float64 `json:"queue_mean_ms"`
	PrefillTokens int64   `json:"prefill_tokens_computed"`
	MakespanS     float64 `json:"makespan_s"` // first arrival to the last step (the slowest replica)
	RequestsPerS  float64 `json:"requests_per_s"`
	OutputTokPerS float64 `json:"output_tokens_per_s"`
	// TTFTQuantilesMs are the TTFT quantiles 0, 1, ..., 100 % (the CDF).
	TTFTQuantilesMs []float64 `json:"ttft_quantiles_ms"`
}

// LatencyReport is the run's time model and its figures with the cache on (measured) and
// off (simulated from the same workload under the same rules and costs).
type LatencyReport struct {
	Time        string            `json:"time"` // virtual or none
	Speed       float64           `json:"speed"`
	CostProfile vtime.CostProfile `json:"cost_profile"`
	Model       vtime.CostModel   `json:"cost_model"` // the profile resolved against the run's layout
	BreakEven   vtime.BreakEven   `json:"break_even"`
	// Warning: with --storage, the profile makes a storage hit slower than recomputing it.
	Warning string         `json:"warning,omitempty"`
	On      LatencyFigures `json:"cache_on"`
	Off     LatencyFigures `json:"cache_off"`
	// TTFTSaved*: quantiles over the requests of each request's own saving (its cache-off
	// TTFT minus its cache-on TTFT), not differences of the two runs' quantiles.
	TTFTSavedP50Ms float64 `json:"ttft_saved_p50_ms"`
	TTFTSavedP90Ms float64 `json:"ttft_saved_p90_ms"`
	TTFTSavedP99Ms float64 `json:"ttft_saved_p99_ms"`
	// PrefetchSync: the run waited for prefetches in steps where nothing decodes.
	PrefetchSync bool `json:"prefetch_sync,omitempty"`
}

// TimelinePoint is the hit rate per tier of the requests admitted in one window of
// virtual time.
type TimelinePoint struct {
	EndS  float64 `json:"end_s"` // end of the window (first tokens before it)
	HitL1 float64 `json:"hit_l1"`
	HitL2 float64 `json:"hit_l2"`
	HitL3 float64 `json:"hit_storage"`
}

// HistogramBin is one bin of a histogram.
type HistogramBin struct {
	LoUs  float64 `json:"lo_us"`
	HiUs  float64 `json:"hi_us"`
	Count int     `json:"count"`
}

const timelinePoints = 60

// QuantileMs is the q-quantile (see quantile) of sorted nanoseconds, in milliseconds.
func QuantileMs(sorted []int64, q float64) float64 { return float64(Quantile(sorted, q)) / 1e6 }

// Figures computes latency figures from the timings of every replica.
func Figures(reps []ReplicaTiming, outputTokens int64) LatencyFigures {
	var ttft, queue []int64
	var f LatencyFigures
	var queueSum float64
	for _, r := range reps {
		for _, t := range r.Requests {
			ttft = append(ttft, t.TTFTNs)
			queue = append(queue, t.QueueNs)
			queueSum += float64(t.QueueNs)
		}
		f.PrefillTokens += r.ComputedTokens
		f.MakespanS = max(f.MakespanS, r.MakespanNs/1e9)
	}
	slices.Sort(ttft)
	slices.Sort(queue)
	f.TTFTP50Ms, f.TTFTP90Ms, f.TTFTP99Ms = QuantileMs(ttft, 0.5), QuantileMs(ttft, 0.9), QuantileMs(ttft, 0.99)
	f.QueueP50Ms, f.QueueP99Ms = QuantileMs(queue, 0.5), QuantileMs(queue, 0.99)
	if len(queue) > 0 {
		f.QueueMeanMs = queueSum / float64(len(queue)) / 1e6
	}
	if f.MakespanS > 0 {
		f.RequestsPerS = float64(len(ttft)) / f.MakespanS
		f.OutputTokPerS = float64(outputTokens) / f.MakespanS
	}
	if len(ttft) > 0 {
		for q := 0; q <= 100; q++ {
			f.TTFTQuantilesMs = append(f.TTFTQuantilesMs, QuantileMs(ttft, float64(q)/100))
		}
	}
	return f
}

// Timeline buckets the requests by the virtual time of their first token into windows
// and gives each window's hit rate per tier.
func Timeline(reps []ReplicaTiming) []TimelinePoint {
	var all []vtime.RequestTiming
	for _, r := range reps {
		all = append(all, r.Requests...)
	}
	if len(all) == 0 {
		return nil
	}
	end := func(t vtime.RequestTiming) int64 { return t.ArrivalNs + t.TTFTNs }
	slices.SortFunc(all, func(a, b vtime.RequestTiming) int { return cmp.Compare(end(a), end(b)) })
	first, last := end(all[0]), end(all[len(all)-1])
	width := max(float64(last-first)/timelinePoints, 1)
	var out []TimelinePoint
	var n, h1, h2, h3 int64
	w := 1
	flush := func() {
		if n > 0 {
			out = append(out, TimelinePoint{EndS: (float64(first) + float64(w)*width) / 1e9,
				HitL1: float64(h1) / float64(n), HitL2: float64(h2) / float64(n), HitL3: float64(h3) / float64(n)})
		}
		n, h1, h2, h3 = 0, 0, 0, 0
	}
	for _, t := range all {
		for float64(end(t)-first) > float64(w)*width && w < timelinePoints {
			flush()
			w++
		}
		n += int64(t.Prompt)
		h1 += int64(t.HitL1)
		h2 += int64(t.HitL2)
		h3 += int64(t.HitL3)
	}
	flush()
	return out
}

// Histogram bins latencies on a log scale (bins of a factor 2^(1/4)).
func Histogram(sorted []time.Duration) []HistogramBin {
	if len(sorted) == 0 {
		return nil
	}
	const perOctave = 4
	lo := math.Max(float64(sorted[0])/1e3, 0.1)
	var bins []HistogramBin
	edge := func(i int) float64 { return lo * math.Pow(2, float64(i)/perOctave) }
	i := 0
	for _, d := range sorted {
		us := float64(d) / 1e3
		for us >= edge(i+1) {
			i++
		}
		for len(bins) <= i {
			bins = append(bins, HistogramBin{LoUs: edge(len(bins)), HiUs: edge(len(bins) + 1)})
		}
		bins[i].Count++
	}
	return bins
}

// writeTimeText writes the virtual-time, miss and reference part of the text report.
func (r *Report) writeTimeText(w io.Writer) {
	m := r.MissCauses
	fmt.Fprintf(w, "  misses by cause      compulsory %d, capacity L1 %d, capacity L2 %d, in flight %d, quarantined %d, storage %d, skipped for cost %d, partial page %d\n",
		m.Compulsory, m.CapacityL1, m.CapacityL2, m.InFlight, m.Quarantined, m.Storage, m.Cost, m.PartialPage)
	ref := r.Reference
	fmt.Fprintf(w, "  reference hit rates  unlimited %.1f%%, LRU of %d-token blocks (%d tokens) %.1f%%\n",
		100*ref.ReuseBoundHitRate, ref.BlockSize(), ref.CapacityTokens, 100*ref.LRUBlockHitRate)
	l := r.Latency
	if l == nil {
		return
	}
	fmt.Fprintf(w, "  time                 %s (speed %g), cost %s\n", l.Time, l.Speed, l.CostProfile.String())
	fmt.Fprintf(w, "  cost model           %s\n", l.Model.String())
	be := l.BreakEven
	pays := fmt.Sprintf("a prefetch pays off for prompts over %.0f tokens (SGLang's fixed prefetch_threshold: %d)", be.MinPromptTokens, vtime.SGLangPrefetchThreshold)
	if be.Never {
		pays = "no prefetch pays off"
	}
	fmt.Fprintf(w, "  break-even           storage %.3g tokens/s, prefill %.3g tokens/s: %s\n", be.StorageTokensPerS, be.PrefillTokensPerS, pays)
	if l.Warning != "" {
		fmt.Fprintf(w, "  WARNING              %s\n", l.Warning)
	}
	row := func(name string, f LatencyFigures) {
		fmt.Fprintf(w, "  %-20s TTFT p50 %.1f ms, p90 %.1f ms, p99 %.1f ms; queue p50 %.1f ms, p99 %.1f ms; %d prefill tokens; %.2f req/s, %.0f output tok/s over %.1f s\n",
			name, f.TTFTP50Ms, f.TTFTP90Ms, f.TTFTP99Ms, f.QueueP50Ms, f.QueueP99Ms, f.PrefillTokens, f.RequestsPerS, f.OutputTokPerS, f.MakespanS)
	}
	if l.Time == vtime.None {
		// Every request arrived at 0: a "TTFT" would be the queue of the whole workload, not
		// a serving latency. The work the cache saved is the figure.
		work := func(name string, f LatencyFigures) {
			fmt.Fprintf(w, "  %-20s %d prefill tokens; %.2f req/s, %.0f output tok/s over %.1f s (no TTFT: --time none serves every request from 0)\n",
				name, f.PrefillTokens, f.RequestsPerS, f.OutputTokPerS, f.MakespanS)
		}
		work("cache on", l.On)
		work("cache off", l.Off)
		fmt.Fprintf(w, "  prefill tokens saved %s\n", r.pct(l.Off.PrefillTokens-l.On.PrefillTokens))
		return
	}
	row("cache on", l.On)
	row("cache off", l.Off)
	fmt.Fprintf(w, "  TTFT saved           per request (off minus on): p50 %.1f ms, p90 %.1f ms, p99 %.1f ms; prefill tokens saved %s\n",
		l.TTFTSavedP50Ms, l.TTFTSavedP90Ms, l.TTFTSavedP99Ms, r.pct(l.Off.PrefillTokens-l.On.PrefillTokens))
}
