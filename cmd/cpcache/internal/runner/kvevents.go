package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/zmq"
)

// EnvKVEventsDump names a directory where each replica's publishing rank writes, after its
// last step, the pages its cache holds per tier (replica-<d>.json: {"device": [...], "host":
// [...], "storage": [...]}, page ids in hex), and after its n-th flush by --fault flush the
// same with "next_seq", the seq of the first batch after the flush's (replica-<d>-flush-<n>.json,
// from 1): for tests that rebuild them from the events.
const EnvKVEventsDump = "CPCACHE_KV_EVENTS_DUMP"

// checkKVEvents refuses, before any rank starts: --kv-events-replay without --kv-events,
// an endpoint that is malformed, that could not be bound where it must be, or that cannot
// be numbered for the last replica (a port pushed past 65535), a negative history bound, and
// a machine without libzmq.
func (p *Plan) checkKVEvents() error {
	c := &p.Config
	if c.KVEvents == "" {
		if c.KVEventsReplay != "" {
			return bad("--kv-events-replay %s needs --kv-events", c.KVEventsReplay)
		}
		return nil
	}
	for _, dp := range []int{0, p.Layout.AttnDP - 1} {
		if _, err := kvevents.OffsetEndpoint(c.KVEvents, dp, kvevents.Bindable(c.KVEvents)); err != nil {
			return bad("--kv-events %q: %v", c.KVEvents, err)
		}
		if _, err := kvevents.OffsetEndpoint(c.KVEventsReplay, dp, true); err != nil {
			return bad("--kv-events-replay %q: %v", c.KVEventsReplay, err)
		}
	}
	if c.KVEventsHistoryMiB < 0 {
		return bad("--kv-events-history-mib %d is negative", c.KVEventsHistoryMiB)
	}
	if _, err := zmq.Open(); err != nil {
		return bad("--kv-events %s: %v", c.KVEvents, err)
	}
	return nil
}

// kvEventOptions are the cache's event options for --kv-events: the cache keeps a ring
// only for the replay socket (a quarter of the history's bound: the publisher fills gaps
// of its subscription from it), none without one.
func (c *Config) kvEventOptions() hicache.EventOptions {
	if c.KVEventsReplay == "" {
		return hicache.EventOptions{Enabled: true, NoRing: true}
	}
	return hicache.EventOptions{Enabled: true, Ring: 1024, RingBytes: c.kvHistoryBytes() / 4}
}

// kvHistoryBytes is --kv-events-history-mib in bytes (0: kvevents' default).
func (c *Config) kvHistoryBytes() int64 {
	if c.KVEventsHistoryMiB == 0 {
		return kvevents.DefaultHistoryBytes
	}
	return int64(c.KVEventsHistoryMiB) << 20
}

type kvPublisher struct {
	pub     *kvevents.Publisher
	dp      int
	dump    string
	flushes int // dumps written after flushes
}

// startKVEvents publishes replica dp's events on its endpoints (see Config.KVEvents).
func startKVEvents(cache *hicache.Cache, cfg *Config, dp, rank int) (*kvPublisher, error) {
	ep, err := kvevents.OffsetEndpoint(cfg.KVEvents, dp, kvevents.Bindable(cfg.KVEvents))
	if err != nil {
		return nil, bad("--kv-events: %v", err)
	}
	replay, err := kvevents.OffsetEndpoint(cfg.KVEventsReplay, dp, true)
	if err != nil {
		return nil, bad("--kv-events-replay: %v", err)
	}
	pub, err := kvevents.Start(cache, kvevents.Options{Endpoint: ep, ReplayEndpoint: replay,
		HistoryBytes: cfg.kvHistoryBytes(),
		Log:          func(err error) { fmt.Fprintf(os.Stderr, "cpcache: rank %d: %v\n", rank, err) }})
	if err != nil {
		return nil, fmt.Errorf("runner: rank %d (replica %d): %w", rank, dp, err)
	}
	return &kvPublisher{pub: pub, dp: dp, dump: os.Getenv(EnvKVEventsDump)}, nil
}

// close writes the dump (EnvKVEventsDump) and closes the publisher once its last batch is
// sent.
func (p *kvPublisher) close(cache *hicache.Cache) error {
	var dumpErr error
	if p.dump != "" {
		dumpErr = p.writeDump(cache, fmt.Sprintf("replica-%d.json", p.dp), nil)
	}
	return errors.Join(p.pub.Close(), dumpErr)
}

// flushed writes the dump of a flush just made (see EnvKVEventsDump); nothing without one.
func (p *kvPublisher) flushed(cache *hicache.Cache) error {
	if p.dump == "" {
		return nil
	}
	seq, err := cache.NextEventSeq()
	if err != nil {
		return err
	}
	p.flushes++
	return p.writeDump(cache, fmt.Sprintf("replica-%d-flush-%d.json", p.dp, p.flushes), &seq)
}

// writeDump writes the pages cache holds per tier to name in the dump directory, with
// next_seq when given.
func (p *kvPublisher) writeDump(cache *hicache.Cache, name string, nextSeq *uint64) error {
	held := cache.HeldPages()
	raw, err := json.Marshal(struct {
		NextSeq *uint64          `json:"next_seq,omitempty"`
		Device  []hicache.PageID `json:"device"`
		Host    []hicache.PageID `json:"host"`
		Storage []hicache.PageID `json:"storage"`
	}{nextSeq, held[hicache.TierDevice], held[hicache.TierHost], held[hicache.TierStorage]})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.dump, name), raw, 0o644)
}

// collectors export the publisher's counters (see kvevents.Stats).
func (p *kvPublisher) collectors(labels prometheus.Labels) []prometheus.Collector {
	var out []prometheus.Collector
	family := func(name, help, label string, values map[string]func(kvevents.Stats) uint64) {
		for v, get := range values {
			l := prometheus.Labels{label: v}
			for k, x := range labels {
				l[k] = x
			}
			out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "cpcache", Subsystem: "run",
				Name: name, Help: help, ConstLabels: l}, func() float64 { return float64(get(p.pub.Stats())) }))
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
	out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cpcache", Subsystem: "run", Name: "kv_event_history_bytes",
		Help: "Encoded bytes of the KV event batches kept for replay.", ConstLabels: labels},
		func() float64 { return float64(p.pub.Stats().HistoryBytes) }))
	out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cpcache", Subsystem: "run", Name: "kv_event_subscriber_queued_bytes",
		Help: "Bytes of KV event batches queued for the PUB socket's subscribers, each queue's counted (at most the per-subscriber bound each).", ConstLabels: labels},
		func() float64 { return float64(p.pub.Stats().SubscriberQueuedBytes) }))
	out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cpcache", Subsystem: "run", Name: "kv_event_subscriber_held_bytes",
		Help: "Memory the subscribers' queues take: a batch queued for several subscribers held once.", ConstLabels: labels},
		func() float64 { return float64(p.pub.Stats().SubscriberHeldBytes) }))
	return out
}
