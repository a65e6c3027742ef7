package metrics

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/storage"
)

// NewRankRegistry is the registry of what one rank exports: its cache's Collector (with
// st's counters when st is not nil) and, on a replica's publishing rank (pub not nil), the
// KV event publisher's (PublisherCollectors). `cpcache run` adds its workload counters;
// job.Open builds it for every rank (libcpcache's cpcache_metrics_text, Python's
// Cache.metrics_text).
func NewRankRegistry(cache *hicache.Cache, labels Labels, st storage.Storage, pub *kvevents.Publisher) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(cache, labels, st))
	if pub != nil {
		reg.MustRegister(PublisherCollectors(pub, labels.Labels())...)
	}
	return reg
}

// ServingRegistry holds the Go and process collectors of the process that serves /metrics.
func ServingRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Text is what g gathers in Prometheus' text exposition format (version 0.0.4).
func Text(g prometheus.Gatherer) ([]byte, error) {
	fams, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return buf.Bytes(), nil
}

// Server serves a gatherer's metrics on /metrics over HTTP until Close.
type Server struct {
	srv  *http.Server
	addr string
}

// Serve serves what g gathers on addr's /metrics. The listener is opened before it returns,
// so a bad or busy address is an error naming it at once.
func Serve(addr string, g prometheus.Gatherer) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, addr: ln.Addr().String()}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on (the port chosen for ":0").
func (s *Server) Addr() string { return s.addr }

// Close stops serving and closes the open connections. Idempotent.
func (s *Server) Close() error {
	if err := s.srv.Close(); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}

// PublisherCollectors export a KV event publisher's counters (see kvevents.Stats) with
// labels: cpcache_run_kv_event_* families (the names `cpcache run` introduced them under,
// which dashboards use).
func PublisherCollectors(pub *kvevents.Publisher, labels prometheus.Labels) []prometheus.Collector {
	var out []prometheus.Collector
	family := func(name, help, label string, values map[string]func(kvevents.Stats) uint64) {
		for v, get := range values {
			l := prometheus.Labels{label: v}
			for k, x := range labels {
				l[k] = x
			}
			out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "cpcache", Subsystem: "run",
				Name: name, Help: help, ConstLabels: l}, func() float64 { return float64(get(pub.Stats())) }))
		}
	}
	family("kv_event_batches_total", "KV event batches: published (taken by the PUB socket), dropped_for_subscriber (dropped for a subscriber whose queue was full, once per subscriber), send_failed (refused by the PUB socket), lost (dropped before the publisher read them), replayed (sent in replay replies).", "outcome",
		map[string]func(kvevents.Stats) uint64{
			"published":              func(s kvevents.Stats) uint64 { return s.Published },
			"dropped_for_subscriber": func(s kvevents.Stats) uint64 { return s.SubscriberDropped },
			"send_failed":            func(s kvevents.Stats) uint64 { return s.SendFailed },
			"lost":                   func(s kvevents.Stats) uint64 { return s.Lost },
			"replayed":               func(s kvevents.Stats) uint64 { return s.ReplaySent },
		})
	family("kv_event_connections_total", "KV event socket connections: cut (a peer's frame or message over the bound, a message of more than 4 frames, not ZMTP 3), and as libzmq reports them, accepted, disconnected (a peer left or was cut), handshake_failed.", "event",
		map[string]func(kvevents.Stats) uint64{
			"cut":              func(s kvevents.Stats) uint64 { return s.Cut },
			"accepted":         func(s kvevents.Stats) uint64 { return s.Accepted },
			"disconnected":     func(s kvevents.Stats) uint64 { return s.Disconnected },
			"handshake_failed": func(s kvevents.Stats) uint64 { return s.HandshakeFailed },
		})
	family("kv_event_replay_requests_total", "KV event replay requests: served (well-formed), bad (ignored), cut (the client left or read nothing for the replay timeout).", "outcome",
		map[string]func(kvevents.Stats) uint64{
			"served": func(s kvevents.Stats) uint64 { return s.ReplayRequests },
			"bad":    func(s kvevents.Stats) uint64 { return s.ReplayBadRequests },
			"cut":    func(s kvevents.Stats) uint64 { return s.ReplayCut },
		})
	gauge := func(name, help string, get func(kvevents.Stats) int64) {
		out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cpcache", Subsystem: "run", Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(get(pub.Stats())) }))
	}
	gauge("kv_event_history_bytes", "Encoded bytes of the KV event batches kept for replay.",
		func(s kvevents.Stats) int64 { return s.HistoryBytes })
	gauge("kv_event_subscriber_queued_bytes", "Bytes of KV event batches queued for the PUB socket's subscribers, each queue's counted (at most the per-subscriber bound each).",
		func(s kvevents.Stats) int64 { return s.SubscriberQueuedBytes })
	gauge("kv_event_subscriber_held_bytes", "Memory the subscribers' queues take: a batch queued for several subscribers held once.",
		func(s kvevents.Stats) int64 { return s.SubscriberHeldBytes })
	return out
}
