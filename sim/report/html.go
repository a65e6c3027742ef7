package report

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/cpcache/cpcache/workload"
)

// Chart ids of the HTML report (each a <figure id=...> holding one inline SVG).
const (
	ChartHitTimeline = "hit-rate-timeline"
	ChartTTFTCDF     = "ttft-cdf"
	ChartMisses      = "miss-attribution"
	ChartConsensus   = "consensus-latency"
	ChartSweep       = "sweep-hit-rate"
)

// WriteHTML writes a self-contained HTML report with inline SVG charts: hit rate per tier
// over virtual time, the TTFT CDF with the cache on and off, the miss attribution, the
// consensus-latency histogram (of rep), and with a sweep the hit rate against the swept
// parameter beside the reference curves. Each chart is a <figure> with the chart's id and
// a data-points attribute (how many values it draws).
func WriteHTML(w io.Writer, rep *Report, sweep *SweepResult) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>cpcache run report</title>\n"+
		"<style>body{font-family:sans-serif;margin:1.5em;max-width:1280px}figure{display:inline-block;margin:0.5em;vertical-align:top}"+
		"pre{background:#f4f4f4;padding:1em;font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere}figcaption{font-size:13px;max-width:576px}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style>\n"+
		"</head><body>\n<h1>cpcache run report</h1>\n")
	var text strings.Builder
	rep.WriteText(&text)
	if sweep != nil && len(sweep.Values) > 0 {
		// The text and the per-run charts are of one run: the sweep's last value.
		fmt.Fprintf(&b, "<h2 id=\"run-label\">The run at %s=%s (the sweep's last value): report and charts below</h2>\n",
			html.EscapeString(sweep.Param), html.EscapeString(sweep.Values[len(sweep.Values)-1]))
	}
	fmt.Fprintf(&b, "<pre id=\"report-text\">%s</pre>\n", html.EscapeString(text.String()))
	if sweep != nil {
		var t strings.Builder
		WriteSweepTable(&t, sweep)
		fmt.Fprintf(&b, "<h2>Sweep of %s</h2>\n<pre>%s</pre>\n", html.EscapeString(sweep.Param), html.EscapeString(t.String()))
	}
	charts := []func(*Report, *SweepResult) (string, string, int, *plot.Plot, error){hitTimelineChart, ttftChart, missChart, consensusChart}
	if sweep != nil {
		charts = append(charts, sweepChart)
	}
	for _, chart := range charts {
		id, caption, n, p, err := chart(rep, sweep)
		if err != nil {
			return err
		}
		if sweep != nil && id != ChartSweep && len(sweep.Values) > 0 {
			p.Title.Text += fmt.Sprintf(" (%s=%s)", sweep.Param, sweep.Values[len(sweep.Values)-1])
		}
		svg, err := renderSVG(p)
		if err != nil {
			return fmt.Errorf("report: chart %s: %w", id, err)
		}
		fmt.Fprintf(&b, "<figure id=\"%s\" data-points=\"%d\">%s<figcaption>%s</figcaption></figure>\n", id, n, svg, html.EscapeString(caption))
	}
	b.WriteString("</body></html>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// renderSVG draws p as an SVG element (without its XML declaration, to inline it).
func renderSVG(p *plot.Plot) (string, error) {
	wt, err := p.WriterTo(6*vg.Inch, 3.6*vg.Inch, "svg")
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return "", err
	}
	s := b.String()
	if i := strings.Index(s, "<svg"); i >= 0 {
		s = s[i:]
	}
	return s, nil
}

func hitTimelineChart(rep *Report, _ *SweepResult) (string, string, int, *plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Hit rate per tier over virtual time"
	p.X.Label.Text = "virtual time (s)"
	p.Y.Label.Text = "prompt tokens hit"
	// The legend sits above 1, where no hit rate reaches, so it hides no curve.
	p.Y.Min, p.Y.Max = 0, legendRoom(len(tiersOf(rep)))
	p.Y.Tick.Marker = unitTicks{}
	p.Legend.Top = true
	tiers := tiersOf(rep)
	var args []any
	n := 0
	for _, tier := range tiers {
		xy := make(plotter.XYs, len(rep.Timeline))
		for i, t := range rep.Timeline {
			xy[i] = plotter.XY{X: t.EndS, Y: tier.v(t)}
		}
		n += len(xy)
		args = append(args, tier.name, xy)
	}
	err := plotutil.AddLinePoints(p, args...)
	return ChartHitTimeline, "Share of the prompt tokens of the requests whose first token falls in each window served from each tier.", n, p, err
}

type tier struct {
	name string
	v    func(TimelinePoint) float64
}

// tiersOf is the tiers the timeline draws: L1, L2 and, with storage, L3.
func tiersOf(rep *Report) []tier {
	tiers := []tier{{"L1", func(t TimelinePoint) float64 { return t.HitL1 }}, {"L2", func(t TimelinePoint) float64 { return t.HitL2 }}}
	if rep.Storage != "" {
		tiers = append(tiers, tier{"storage", func(t TimelinePoint) float64 { return t.HitL3 }})
	}
	return tiers
}

// legendRoom is the top of a 0..1 axis that leaves room above 1 for a legend of n entries.
func legendRoom(n int) float64 { return 1 + 0.12*float64(n) }

// unitTicks are the ticks of a 0..1 axis (0, 0.2, ..., 1) and none in the legend's room above.
type unitTicks struct{}

func (unitTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		if v < lo || v > hi {
			continue
		}
		label := ""
		if i%2 == 0 {
			label = strconv.FormatFloat(v, 'f', -1, 64)
		}
		ts = append(ts, plot.Tick{Value: v, Label: label})
	}
	return ts
}

// countTicks are plot's default ticks labelled as whole counts ("500000", not "500000.00");
// a tick between whole numbers (a small range) keeps no label.
type countTicks struct{}

func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label == "" {
			continue
		}
		if v := ts[i].Value; v == math.Trunc(v) {
			ts[i].Label = strconv.FormatFloat(v, 'f', 0, 64)
		} else {
			ts[i].Label = ""
		}
	}
	return ts
}

func ttftChart(rep *Report, _ *SweepResult) (string, string, int, *plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Time to first token (CDF)"
	p.X.Label.Text = "TTFT (ms, log)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	n := 0
	var args []any
	if l := rep.Latency; l != nil {
		for _, f := range []struct {
			name string
			q    []float64
		}{{"cache on", l.On.TTFTQuantilesMs}, {"cache off", l.Off.TTFTQuantilesMs}} {
			xy := make(plotter.XYs, len(f.q))
			for i, v := range f.q {
				xy[i] = plotter.XY{X: max(v, 1e-3), Y: float64(i) / 100}
			}
			n += len(xy)
			args = append(args, f.name, xy)
		}
	}
	err := plotutil.AddLines(p, args...)
	return ChartTTFTCDF, "TTFT in virtual time with the cache on (measured) and off (simulated from the same workload and costs).", n, p, err
}

// missCause is one bar of missChart: a cause and the prompt tokens it missed.
type missCause struct {
	name string
	v    int64
}

// missChart draws the missed prompt tokens of each cause that missed any, every bar labelled
// with its count and share of the misses, so that a cause a thousand times smaller than the
// compulsory misses still reads (its bar is a sliver; its label says what it is).
func missChart(rep *Report, _ *SweepResult) (string, string, int, *plot.Plot, error) {
	m := rep.MissCauses
	causes := []missCause{{"compulsory", m.Compulsory}, {"capacity L1", m.CapacityL1}, {"capacity L2", m.CapacityL2}, {"in flight", m.InFlight},
		{"quarantined", m.Quarantined}, {"storage", m.Storage}, {"skipped for cost", m.Cost}, {"partial page", m.PartialPage}}
	var total int64
	nonzero := 0
	for _, c := range causes {
		total += c.v
		if c.v > 0 {
			nonzero++
		}
	}
	if total > 0 {
		causes = slices.DeleteFunc(causes, func(c missCause) bool { return c.v == 0 })
	}
	p := plot.New()
	p.Title.Text = "Missed prompt tokens by cause"
	p.Y.Label.Text = "tokens"
	p.Y.Tick.Marker = countTicks{}
	vals := make(plotter.Values, len(causes))
	names := make([]string, len(causes))
	labels := plotter.XYLabels{XYs: make(plotter.XYs, len(causes)), Labels: make([]string, len(causes))}
	var most float64
	for i, c := range causes {
		vals[i], names[i] = float64(c.v), c.name
		most = max(most, float64(c.v))
		labels.XYs[i] = plotter.XY{X: float64(i), Y: float64(c.v)}
		labels.Labels[i] = strconv.FormatInt(c.v, 10)
		if total > 0 {
			labels.Labels[i] += fmt.Sprintf(" (%.1f%%)", 100*float64(c.v)/float64(total))
		}
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(30))
	if err != nil {
		return ChartMisses, "", 0, nil, err
	}
	bars.Color = plotutil.Color(2)
	p.Add(bars)
	text, err := plotter.NewLabels(labels)
	if err != nil {
		return ChartMisses, "", 0, nil, err
	}
	for i := range text.TextStyle {
		text.TextStyle[i].XAlign, text.TextStyle[i].YAlign = draw.XCenter, draw.YBottom
	}
	text.Offset = vg.Point{Y: vg.Points(2)}
	p.Add(text)
	p.NominalX(names...)
	p.Y.Min, p.Y.Max = 0, max(1, most*1.15) // room above the tallest bar for its label
	return ChartMisses, fmt.Sprintf("Every missed prompt token under one cause (%d tokens missed); causes that missed nothing are left out.", rep.TokensMissed), nonzero, p, nil
}

func consensusChart(rep *Report, _ *SweepResult) (string, string, int, *plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Consensus step latency"
	p.X.Label.Text = "all-reduce latency (µs, log)"
	p.Y.Label.Text = "steps"
	p.Y.Tick.Marker = countTicks{}
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	h := &plotter.Histogram{FillColor: plotutil.Color(0), LineStyle: plotter.DefaultLineStyle}
	n := 0
	for _, b := range rep.ConsensusHistogram {
		h.Bins = append(h.Bins, plotter.HistogramBin{Min: b.LoUs, Max: b.HiUs, Weight: float64(b.Count)})
		n += b.Count
	}
	if len(h.Bins) > 0 {
		h.Width = h.Bins[0].Max - h.Bins[0].Min
		p.Add(h)
	}
	return ChartConsensus, "Wall-clock latency of the consensus all-reduce of the latest steps of every rank (real time, not virtual).", n, p, nil
}

func sweepChart(_ *Report, sw *SweepResult) (string, string, int, *plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Hit rate against " + sw.Param
	p.X.Label.Text = sw.Param
	p.Y.Label.Text = "hit rate"
	p.Y.Min, p.Y.Max = 0, legendRoom(3) // the legend above 1 hides no curve
	p.Y.Tick.Marker = unitTicks{}
	p.Legend.Top = true
	blockTokens := workload.BlockTokens // the LRU reference's block (512/N at --trace-scale N)
	if len(sw.Reports) > 0 {
		blockTokens = sw.Reports[0].Reference.BlockSize()
	}
	lines := []struct {
		name string
		v    func(*Report) float64
	}{
		{"measured", func(r *Report) float64 { return r.HitRate }},
		{fmt.Sprintf("LRU of %d-token blocks", blockTokens), func(r *Report) float64 { return r.Reference.LRUBlockHitRate }},
		{"unlimited", func(r *Report) float64 { return r.Reference.ReuseBoundHitRate }},
	}
	var args []any
	n := 0
	for _, l := range lines {
		xy := make(plotter.XYs, len(sw.Reports))
		for i, r := range sw.Reports {
			xy[i] = plotter.XY{X: float64(i), Y: l.v(r)}
		}
		n += len(xy)
		args = append(args, l.name, xy)
	}
	err := plotutil.AddLinePoints(p, args...)
	p.NominalX(sw.Values...)
	return ChartSweep, "Measured hit rate at each value, beside an LRU over " + strconv.Itoa(blockTokens) + "-token blocks of the same capacity and the unlimited-capacity bound (where the measured line hides the LRU one, the cache hits what an LRU of its capacity would).", n, p, err
}
