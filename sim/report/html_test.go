package report

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/sim/vtime"
)

// htmlSweep is a sweep of three runs with every chart's data: long report lines, a timeline
// whose L2 hit rate runs near the top of its axis, miss counts in the hundreds of thousands.
func htmlSweep() (*Report, *SweepResult) {
	sw := &SweepResult{Param: "l2-pages", Values: []string{"160", "400", "2048"}}
	for i := range sw.Values {
		r := &Report{InputTokens: 6_000_000, TokensHitL2: int64(2_000_000 * (i + 1)), HitRate: 0.3 * float64(i+1),
			MissCauses: MissCauses{Compulsory: 590_336, CapacityL2: int64(300_000 / (i + 1))},
			Reference:  Reference{LRUBlockHitRate: 0.3 * float64(i+1), ReuseBoundHitRate: 0.904},
			Latency: &LatencyReport{Time: vtime.Virtual, Speed: 1,
				On:  LatencyFigures{TTFTP50Ms: 7.8, TTFTQuantilesMs: []float64{1, 5, 8, 12}},
				Off: LatencyFigures{TTFTP50Ms: 21.6, TTFTQuantilesMs: []float64{2, 15, 22, 400}}},
			ConsensusHistogram: []HistogramBin{{LoUs: 100, HiUs: 119, Count: 250_000}, {LoUs: 119, HiUs: 141, Count: 500_000}}}
		for w := range 30 {
			r.Timeline = append(r.Timeline, TimelinePoint{EndS: float64(w + 1), HitL1: 0.06, HitL2: 0.96})
		}
		sw.Reports = append(sw.Reports, r)
	}
	return sw.Reports[len(sw.Reports)-1], sw
}

// TestHTMLReportLabelsAndAxes: on a sweep the text and the per-run charts name the value they
// are of; count axes are labelled in whole numbers, not "500000.00"; the 0..1 axes leave room
// above 1 for their legends, so a curve near 1 (the L2 hit rate) is not under the legend; the
// report text wraps instead of running past the page.
func TestHTMLReportLabelsAndAxes(t *testing.T) {
	last, sw := htmlSweep()
	var b strings.Builder
	require.NoError(t, WriteHTML(&b, last, sw))
	page := b.String()
	assert.True(t, strings.Contains(page, "The run at l2-pages=2048 (the sweep's last value)"), "The run at l2-pages=2048 (the sweep's last value)")
	assert.True(t, strings.Contains(page, "Hit rate per tier over virtual time (l2-pages=2048)"), "Hit rate per tier over virtual time (l2-pages=2048)")
	assert.True(t, strings.Contains(page, "Missed prompt tokens by cause (l2-pages=2048)"), "Missed prompt tokens by cause (l2-pages=2048)")
	assert.False(t, strings.Contains(page, "Hit rate against l2-pages (l2-pages="), "the sweep chart is of every value")
	assert.True(t, strings.Contains(page, "white-space:pre-wrap"), "white-space:pre-wrap")
	assert.False(t, regexp.MustCompile(`>\d+\.00<`).MatchString(page), "no count axis label ends in .00")
	assert.True(t, strings.Contains(page, ">500000<"), "the steps axis counts whole steps")
	for _, want := range []string{">0<", ">0.2<", ">1<"} {
		assert.True(t, strings.Contains(page, want), "the 0..1 axes keep their label %s", want)
	}
	assert.False(t, strings.Contains(page, ">1.2<"), "no hit-rate label in the legend's room above 1")
	assert.Equal(t, 1.24, legendRoom(2), "two legend entries get 0.24 above 1")
	assert.True(t, strings.Contains(page, "LRU over 512-token blocks"), "an unscaled sweep's LRU is of 512-token blocks")

	// A sweep over a trace read at --trace-scale 8: its LRU reference is of 64-token blocks.
	for _, r := range sw.Reports {
		r.Reference.LRUBlockSize = 64
	}
	b.Reset()
	require.NoError(t, WriteHTML(&b, last, sw))
	page = b.String()
	assert.True(t, strings.Contains(page, "LRU over 64-token blocks"), "the sweep chart names the trace's scaled block")
	assert.True(t, strings.Contains(page, "LRU of 64-token blocks"), "so does its legend")
	assert.False(t, strings.Contains(page, "512-token"), "nothing says 512-token blocks")
}

// TestHTMLReportRendersInChromium renders the page in headless Chromium at 1300 px and asks the
// page itself: the report text is not clipped (no box scrolls sideways, nothing runs past the
// page) and every chart is drawn (an SVG with a non-empty box and drawn paths).
func TestHTMLReportRendersInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("needs Debian's chromium (apt-get install chromium) to render the page: not on PATH")
	}
	last, sw := htmlSweep()
	var b strings.Builder
	require.NoError(t, WriteHTML(&b, last, sw))
	check := `<script>
const pre = [...document.querySelectorAll("pre")];
const figs = [...document.querySelectorAll("figure")];
document.body.setAttribute("data-check", JSON.stringify({
  clipped: pre.filter(p => p.scrollWidth > p.clientWidth).length,
  pageWidth: document.documentElement.scrollWidth,
  figures: figs.map(f => { const s = f.querySelector("svg"), r = s ? s.getBoundingClientRect() : {width: 0, height: 0};
    return {id: f.id, width: r.width, height: r.height, paths: s ? s.querySelectorAll("path").length : 0}; }),
}));
</script></body>`
	dir := t.TempDir()
	path := filepath.Join(dir, "report.html")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(b.String(), "</body>", check, 1)), 0o600))
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1300,2300",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--dump-dom", "file://"+path)
	out, err := cmd.Output()
	require.NoError(t, err, "chromium --dump-dom")
	m := regexp.MustCompile(`data-check="([^"]*)"`).FindSubmatch(out)
	require.NotNil(t, m, "the page's check ran:\n%s", out)
	var got struct {
		Clipped   int `json:"clipped"`
		PageWidth float64
		Figures   []struct {
			ID            string
			Width, Height float64
			Paths         int
		}
	}
	unescaped := strings.NewReplacer("&quot;", `"`, "&amp;", "&", "&lt;", "<", "&gt;", ">").Replace(string(m[1]))
	require.NoError(t, json.Unmarshal([]byte(unescaped), &got), unescaped)
	assert.Zero(t, got.Clipped, "a <pre> wider than its box is clipped")
	assert.LessOrEqual(t, got.PageWidth, 1300.0, "nothing runs past a 1300 px window")
	require.Len(t, got.Figures, 5, "four charts of the run and the sweep's")
	for _, f := range got.Figures {
		assert.Greater(t, f.Width, 400.0, f.ID)
		assert.Greater(t, f.Height, 200.0, f.ID)
		assert.Greater(t, f.Paths, 5, "%s: drawn", f.ID)
	}
}

// TestMissChartLabelsEveryCauseThatMissed: with compulsory misses 590 times the capacity
// misses, the small cause's bar is a sliver, so every bar carries its count and share; causes
// that missed nothing get no bar; a run that missed nothing still draws its (empty) chart.
func TestMissChartLabelsEveryCauseThatMissed(t *testing.T) {
	rep := &Report{TokensMissed: 591_336, MissCauses: MissCauses{Compulsory: 590_336, CapacityL2: 1_000}}
	_, caption, n, p, err := missChart(rep, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "two causes missed tokens")
	svg, err := renderSVG(p)
	require.NoError(t, err)
	for _, want := range []string{">590336 (99.8%)<", ">1000 (0.2%)<", ">compulsory<", ">capacity L2<"} {
		assert.Contains(t, svg, want)
	}
	for _, absent := range []string{">quarantined<", ">in flight<", ">capacity L1<"} {
		assert.NotContains(t, svg, absent, "a cause that missed nothing has no bar")
	}
	assert.Contains(t, caption, "591336 tokens missed")

	_, _, n, p, err = missChart(&Report{}, nil)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing missed: no cause has a count (its bars stay, at 0)")
	svg, err = renderSVG(p)
	require.NoError(t, err)
	assert.Contains(t, svg, ">compulsory<")
}
