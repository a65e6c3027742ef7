package runner

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/hicache/metrics"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

const dashboardPath = "../../../../deploy/grafana/cpcache.json"

// rankRegistryOfTestCache returns the registry rank 0 of a two-rank CP group exports, with
// a mem:// storage (so that the storage families are present too).
func rankRegistryOfTestCache(t *testing.T) *prometheus.Registry {
	t.Helper()
	layout, err := parallel.NewLayout(parallel.LayoutConfig{World: 2, AttnCP: 2})
	require.NoError(t, err)
	ns, err := storage.NewNamespace("runner-metrics")
	require.NoError(t, err)
	st, err := stores.Open(t.Context(), "mem://runner-metrics", storage.Options{Namespace: ns})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	groups := local.New(layout.ReplicaGroup(0), local.Options{Kind: "replica"})
	slabs := kvtest.NewMemSlabs(layout.SlabGroup(0), 16, 256)
	caches := make([]*hicache.Cache, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			caches[rank], errs[rank] = hicache.New(context.Background(), hicache.Config{
				Options: hicache.Options{PageSize: 4, L1Pages: 8}, Layout: layout, Rank: rank, Group: groups[rank], Slabs: slabs,
				Storage: st, StorageNamespace: ns,
			})
		})
	}
	wg.Wait()
	for rank, c := range caches {
		require.NoError(t, errs[rank])
		t.Cleanup(func() { c.Close() })
	}
	return rankRegistry(&live{}, metrics.NewRankRegistry(caches[0], metrics.RankLabels(layout, 0), st, nil), metrics.RankLabels(layout, 0))
}

// TestRankMetricsLint: what a rank exports passes the Prometheus linter.
func TestRankMetricsLint(t *testing.T) {
	reg := rankRegistryOfTestCache(t)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestDashboardUsesExportedMetrics: every metric the Grafana dashboard queries is one a rank
// exports (a histogram's _bucket, _sum and _count series count as its family), and the
// dashboard has the panels it promises.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	fams, err := rankRegistryOfTestCache(t).Gather()
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[f.GetName()+s] = true
			}
		}
	}
	raw, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	name := regexp.MustCompile(`\bcpcache_[a-z0-9_]+`)
	var titles []string
	used := 0
	for _, p := range dash.Panels {
		titles = append(titles, p.Title)
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				used++
				assert.True(t, exported[m], "panel %q queries %s, which no rank exports", p.Title, m)
			}
		}
	}
	assert.Greater(t, used, 10)
	for _, want := range []string{"Hit rate per tier", "L2 occupancy", "Consensus latency", "Divergences", "Storage errors"} {
		assert.True(t, slices.ContainsFunc(titles, func(s string) bool { return strings.HasPrefix(s, want) }), "no panel %q in %v", want, titles)
	}
}

// TestReferenceListsMetrics: docs/reference.md's metrics table names every family a rank
// exports, and nothing else.
func TestReferenceListsMetrics(t *testing.T) {
	fams, err := rankRegistryOfTestCache(t).Gather()
	require.NoError(t, err)
	doc, err := os.ReadFile("../../../../docs/reference.md")
	require.NoError(t, err)
	// A table row names its families exactly in its first cell (`name` or `name{labels}`),
	// not by a longer name that merely starts with one.
	listed := map[string]bool{}
	cellName := regexp.MustCompile("`(cpcache_[a-z0-9_]+)[`{]")
	for _, line := range strings.Split(string(doc), "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.TrimSpace(cells[0]) == "" {
			for _, m := range cellName.FindAllStringSubmatch(cells[1], -1) {
				listed[m[1]] = true
			}
		}
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
		assert.True(t, listed[f.GetName()], "docs/reference.md's metrics table lacks %s", f.GetName())
	}
	// And the other way: every family the table lists is exported (the KV event publisher's
	// by the publishing rank: TestKVEventMetrics).
	for name := range listed {
		if !strings.HasPrefix(name, "cpcache_run_kv_event_") {
			assert.True(t, exported[name], "docs/reference.md's metrics table lists %s, which no rank exports", name)
		}
	}
}
