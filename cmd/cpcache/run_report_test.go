package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/sim/report"
)

// conversationTrace writes a Mooncake trace of 6 conversations of 10 turns, each turn's
// blocks its previous turn's plus one, arriving 5 ms apart: 1920 distinct 16-token pages.
func conversationTrace(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 60 {
		conv, turn := i%6, i/6
		ids := make([]string, turn+1)
		for j := range ids {
			ids[j] = strconv.Itoa(conv*100 + j)
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 3, "hash_ids": [%s]}`+"\n",
			5*i, (turn+1)*512-100, strings.Join(ids, ", "))
	}
	path := filepath.Join(t.TempDir(), "conversations.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// svgFigures returns, for each <figure id=...> of an HTML report, its data-points
// attribute and the number of drawn elements (path, rect, polygon) of its SVG, which must
// parse as XML.
func svgFigures(t *testing.T, page string) map[string][2]int {
	t.Helper()
	out := map[string][2]int{}
	fig := regexp.MustCompile(`(?s)<figure id="([^"]+)" data-points="(\d+)">(<svg.*?</svg>)`)
	for _, m := range fig.FindAllStringSubmatch(page, -1) {
		points, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		drawn := 0
		dec := xml.NewDecoder(strings.NewReader(m[3]))
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, "figure %s: its SVG parses", m[1])
			if se, ok := tok.(xml.StartElement); ok && (se.Name.Local == "path" || se.Name.Local == "rect" || se.Name.Local == "polygon") {
				drawn++
			}
		}
		out[m[1]] = [2]int{points, drawn}
	}
	return out
}

func TestRunSweepOverThreeCapacitiesWithHTML(t *testing.T) {
	dir := t.TempDir()
	jsonPath, htmlPath := filepath.Join(dir, "sweep.json"), filepath.Join(dir, "report.html")
	cmd := exec.Command(cpcacheBinary(t), "run", "--world", "2", "--dp", "1", "--attn-cp", "2", "--workload", "trace",
		"--trace", conversationTrace(t), "--page-size", "16", "--l1-pages", "500", "--kv-bytes-per-token", "8", // L1: 1000 pages over the 2 ranks
		"--cost-profile", "unit", "--sweep", "l2-pages=160,400,2048", "--json", jsonPath, "--html", htmlPath)
	cmd.Env = withoutLauncherEnv(nil)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())

	table := stdout.String()[strings.Index(stdout.String(), "l2-pages "):]
	assert.Len(t, strings.Split(strings.TrimSpace(table), "\n"), 4, "a header and one row per value:\n%s", table)
	var sw report.SweepResult
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &sw))
	require.Len(t, sw.Reports, 3)
	assert.Equal(t, []string{"160", "400", "2048"}, sw.Values)
	for i, r := range sw.Reports {
		assert.Equal(t, r.TokensMissed, r.MissCauses.Total(), "value %s: the causes sum to the misses", sw.Values[i])
		assert.Equal(t, 1.0, r.CollectivesPerStep)
		require.NotNil(t, r.Latency)
		assert.Positive(t, r.Latency.On.TTFTP50Ms)
		assert.LessOrEqual(t, r.Latency.On.PrefillTokens, r.Latency.Off.PrefillTokens, "the cache saves prefill")
		assert.Equal(t, sw.Reports[0].Reference.ReuseBoundTokens, r.Reference.ReuseBoundTokens, "the bound does not depend on capacity")
		if i > 0 {
			assert.GreaterOrEqual(t, r.Reference.LRUBlockHitRate, sw.Reports[i-1].Reference.LRUBlockHitRate, "LRU is monotone in capacity")
		}
	}
	small, large := sw.Reports[0], sw.Reports[2]
	assert.Positive(t, small.MissCauses.CapacityL2, "160 pages per slab cannot hold the conversations")
	assert.Zero(t, large.MissCauses.CapacityL1+large.MissCauses.CapacityL2, "2048 pages per slab hold everything")
	assert.Equal(t, large.Reference.ReuseBoundTokens, large.TokensHitL1+large.TokensHitL2+large.MissCauses.InFlight,
		"with room for everything, hits and in-flight misses are the reuse bound")
	assert.Greater(t, large.HitRate, small.HitRate)

	page, err := os.ReadFile(htmlPath)
	require.NoError(t, err)
	figs := svgFigures(t, string(page))
	for _, id := range []string{report.ChartHitTimeline, report.ChartTTFTCDF, report.ChartMisses, report.ChartConsensus, report.ChartSweep} {
		f, ok := figs[id]
		require.True(t, ok, "chart %s is in the report", id)
		assert.Positive(t, f[0], "chart %s has data", id)
		assert.Greater(t, f[1], 4, "chart %s draws more than its frame", id)
	}
	assert.NotContains(t, string(page), "<script", "self-contained, no scripts")
	assert.NotContains(t, string(page), "src=", "self-contained, nothing to fetch")
}

func TestWithoutFlagsDropsSweepOutputs(t *testing.T) {
	args := []string{"--world", "2", "--sweep", "l2-pages=1,2", "-html=r.html", "--json", "x.json", "--trace", "t.jsonl", "--sweep=policy=a"}
	assert.Equal(t, []string{"--world", "2", "--trace", "t.jsonl"}, withoutFlags(args, "sweep", "html", "json"))
}

func TestRunRejectsBadSweepAndCost(t *testing.T) {
	for _, tc := range []struct{ flag, want string }{
		{"--sweep=page-size=1,2", `sweep "page-size=1,2"`},
		{"--sweep=l2-pages=0,8", "l2-pages=0"},
		{"--cost=decode_step_ns=x", `decode_step_ns: value "x"`},
		{"--cost-profile=nope", `cost profile "nope"`},
		{"--time=wall", `time "wall"`},
	} {
		var stdout, stderr strings.Builder
		status := runRun([]string{"--world", "2", "--attn-cp", "2", "--dp", "1", tc.flag}, &stdout, &stderr)
		assert.Equal(t, 2, status, "%s: %s", tc.flag, stderr.String())
		assert.Contains(t, stderr.String(), tc.want, tc.flag)
	}
}
