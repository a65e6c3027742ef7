package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/cpcache/cpcache/hicache/metrics"
)

// Metrics: every rank builds a registry of its cache's metrics.Collector and the runner's
// own counters (rankRegistry). The process that serves /metrics adds its Go and process
// collectors: rank 0 when the ranks run under a launcher, or the `cpcache run` parent of
// local ranks, which reads the ranks' registries from the files they write into the status
// directory (metrics-<rank>.pb, refreshed with the status files).

const metricsFilePrefix = "metrics-"

// rankRegistry is what one rank exports: the rank's registry (job.Rank.Metrics:
// metrics.NewRankRegistry, the cache, its storage, the replica's KV event publisher) with the
// runner's counters added.
func rankRegistry(l *live, reg *prometheus.Registry, labels metrics.Labels) *prometheus.Registry {
	reg.MustRegister(liveCollectors(l, labels.Labels())...)
	return reg
}

// liveCollectors export the runner's counters of one rank: the workload's progress and the
// prompt tokens the hit-rate panels divide by (the cache itself does not see a prompt's
// length). Every rank of a replica runs the same scheduler, so they report the same values.
func liveCollectors(l *live, labels prometheus.Labels) []prometheus.Collector {
	counter := func(name, help string, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "cpcache", Subsystem: "run", Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cpcache", Subsystem: "run", Name: "requests", ConstLabels: labels,
			Help: "Requests in the workload of this rank's replica."}, func() float64 { return float64(l.total.Load()) }),
		counter("requests_done_total", "Requests finished.", l.done.Load),
		counter("prompt_tokens_total", "Prompt tokens of finished prefills.", l.inputTokens.Load),
		counter("hit_tokens_total", "Prompt tokens served from the cache (L1, L2 or storage).", l.hitTokens.Load),
		counter("scheduler_steps_total", "Scheduler steps (one consensus each).", l.steps.Load),
		counter("bad_pages_total", "Loaded pages whose bytes were wrong.", l.badPages.Load),
	}
}

// servingRegistry holds the Go and process collectors of the process that serves /metrics.
func servingRegistry() *prometheus.Registry { return metrics.ServingRegistry() }

// serveMetrics serves what g gathers on addr's /metrics until ctx ends (metrics.Serve). The
// listener is opened before it returns, so a bad or busy address is reported at once.
func serveMetrics(ctx context.Context, addr string, g prometheus.Gatherer) (string, error) {
	srv, err := metrics.Serve(addr, g)
	if err != nil {
		return "", fmt.Errorf("runner: %w", err)
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return srv.Addr(), nil
}

var protoDelim = expfmt.NewFormat(expfmt.TypeProtoDelim)

// writeMetricsFile writes what g gathers to dir/metrics-<rank>.pb (protobuf, lossless).
func writeMetricsFile(dir string, rank int, g prometheus.Gatherer) error {
	fams, err := g.Gather()
	if err != nil {
		return fmt.Errorf("runner: metrics: %w", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, protoDelim)
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return fmt.Errorf("runner: metrics: %w", err)
		}
	}
	return writeBytesAtomic(dir, fmt.Sprintf("%s%d.pb", metricsFilePrefix, rank), buf.Bytes())
}

// statusDirGatherer gathers the metrics files of the ranks in dir; a file that cannot be
// read (a rank not started yet) is skipped.
func statusDirGatherer(dir string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		byName := map[string]*dto.MetricFamily{}
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), metricsFilePrefix) || !strings.HasSuffix(e.Name(), ".pb") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			dec := expfmt.NewDecoder(bytes.NewReader(b), protoDelim)
			for {
				var f dto.MetricFamily
				if err := dec.Decode(&f); err != nil {
					if !errors.Is(err, io.EOF) {
						return nil, fmt.Errorf("runner: metrics file %s: %w", e.Name(), err)
					}
					break
				}
				if have := byName[f.GetName()]; have != nil {
					have.Metric = append(have.Metric, f.Metric...)
				} else {
					byName[f.GetName()] = &f
				}
			}
		}
		names := slices.Sorted(maps.Keys(byName))
		out := make([]*dto.MetricFamily, len(names))
		for i, n := range names {
			out[i] = byName[n]
		}
		return out, nil
	})
}
