package kvevents

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cpcache/cpcache/hicache"
)

// EnvDump names a directory where each replica's publishing rank writes, when its
// ReplicaPublisher closes, the pages its cache holds per tier (replica-<d>.json: {"next_seq":
// n, "device": [...], "host": [...], "storage": [...]}, page ids in hex, n the seq of the
// batch that would follow the last one), and after its n-th flush (ReplicaPublisher.Flushed)
// the same (replica-<d>-flush-<n>.json, from 1): for tests that rebuild them from the events.
const EnvDump = "CPCACHE_KV_EVENTS_DUMP"

// Config is what an engine asks of its replicas' KV events: one publisher per DP replica (on
// the replica's leader), replica d on the endpoints numbered for d (OffsetEndpoint). It is
// the one description `cpcache run --kv-events`, job.Config and libcpcache's cpcache_config
// share.
type Config struct {
	// Endpoint is the PUB socket's address (Options.Endpoint) for replica 0; "" publishes
	// nothing.
	Endpoint string
	// ReplayEndpoint is the replay ROUTER's address for replica 0 (Options.ReplayEndpoint);
	// "" for none.
	ReplayEndpoint string
	// Topic is the first frame of every message (Options.Topic; "" as vLLM's).
	Topic string
	// HistoryBytes bounds the replay history (Options.HistoryBytes; 0: DefaultHistoryBytes).
	HistoryBytes int64
}

// Config fields, as ConfigError names them.
const (
	FieldEndpoint       = "endpoint"
	FieldReplayEndpoint = "replay endpoint"
	FieldHistoryBytes   = "history bytes"
)

// ConfigError is a Config value no replica could publish with: Field (FieldEndpoint, ...)
// and its Value, and what is wrong with it. Callers name the field as their users know it
// (a flag, a C struct field).
type ConfigError struct {
	Field, Value string
	Err          error
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("kv events %s %q: %v", e.Field, e.Value, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// errNeedsEndpoint is the cause of a replay endpoint given without an endpoint.
var errNeedsEndpoint = errors.New("needs an endpoint to publish on")

// Check refuses, before anything starts, what no replica of a job of replicas replicas could
// publish with: a replay endpoint without an endpoint, an endpoint that is malformed, that
// could not be bound where it must be, or that cannot be numbered for the last replica (a
// port pushed past 65535), and a negative history bound: a *ConfigError naming the field.
// It does not load libzmq (Start reports a missing one).
func (c Config) Check(replicas int) error {
	if c.Endpoint == "" {
		if c.ReplayEndpoint != "" {
			return &ConfigError{FieldReplayEndpoint, c.ReplayEndpoint, errNeedsEndpoint}
		}
		return nil
	}
	for _, dp := range []int{0, max(replicas, 1) - 1} {
		if _, err := OffsetEndpoint(c.Endpoint, dp, Bindable(c.Endpoint)); err != nil {
			return &ConfigError{FieldEndpoint, c.Endpoint, err}
		}
		if _, err := OffsetEndpoint(c.ReplayEndpoint, dp, true); err != nil {
			return &ConfigError{FieldReplayEndpoint, c.ReplayEndpoint, err}
		}
	}
	if c.HistoryBytes < 0 {
		return &ConfigError{FieldHistoryBytes, fmt.Sprint(c.HistoryBytes), errors.New("is negative")}
	}
	return nil
}

// EventOptions are the cache's event options for c (hicache.Config.Events, on every rank of
// a replica): none without an endpoint; with one, the cache keeps a ring only for the replay
// socket (a quarter of the history's bound: the publisher fills gaps of its subscription
// from it), none without one.
func (c Config) EventOptions() hicache.EventOptions {
	switch {
	case c.Endpoint == "":
		return hicache.EventOptions{}
	case c.ReplayEndpoint == "":
		return hicache.EventOptions{Enabled: true, NoRing: true}
	}
	return hicache.EventOptions{Enabled: true, Ring: 1024, RingBytes: c.historyBytes() / 4}
}

// historyBytes is HistoryBytes with its default.
func (c Config) historyBytes() int64 {
	if c.HistoryBytes == 0 {
		return DefaultHistoryBytes
	}
	return c.HistoryBytes
}

// ReplicaPublisher publishes one replica's events (its leader's cache) on the endpoints of
// Config numbered for the replica, and writes the dumps of EnvDump when it is set.
type ReplicaPublisher struct {
	*Publisher
	cache   *hicache.Cache
	dp      int
	dump    string // EnvDump's directory ("": none)
	flushes int    // dumps written after flushes
}

// StartReplica publishes replica dp's events from cache (Start with c's endpoints numbered
// for dp). log receives the background loops' errors (nil: dropped).
func StartReplica(cache *hicache.Cache, c Config, dp int, log func(error)) (*ReplicaPublisher, error) {
	ep, err := OffsetEndpoint(c.Endpoint, dp, Bindable(c.Endpoint))
	if err != nil {
		return nil, &ConfigError{FieldEndpoint, c.Endpoint, err}
	}
	replay, err := OffsetEndpoint(c.ReplayEndpoint, dp, true)
	if err != nil {
		return nil, &ConfigError{FieldReplayEndpoint, c.ReplayEndpoint, err}
	}
	pub, err := Start(cache, Options{Endpoint: ep, ReplayEndpoint: replay, Topic: c.Topic, HistoryBytes: c.historyBytes(), Log: log})
	if err != nil {
		return nil, err
	}
	return &ReplicaPublisher{Publisher: pub, cache: cache, dp: dp, dump: os.Getenv(EnvDump)}, nil
}

// Close writes the dump (EnvDump) and closes the publisher once its last batch is sent. The
// cache must still be open. Idempotent as Publisher.Close; the dump is written each time.
func (p *ReplicaPublisher) Close() error {
	var dumpErr error
	if p.dump != "" {
		dumpErr = p.writeDump(fmt.Sprintf("replica-%d.json", p.dp))
	}
	return errors.Join(p.Publisher.Close(), dumpErr)
}

// Flushed writes the dump of a flush just made (see EnvDump); nothing without one.
func (p *ReplicaPublisher) Flushed() error {
	if p.dump == "" {
		return nil
	}
	p.flushes++
	return p.writeDump(fmt.Sprintf("replica-%d-flush-%d.json", p.dp, p.flushes))
}

// writeDump writes the pages the cache holds per tier, with the next batch's seq, to name in
// the dump directory.
func (p *ReplicaPublisher) writeDump(name string) error {
	seq, err := p.cache.NextEventSeq()
	if err != nil {
		return err
	}
	held := p.cache.HeldPages()
	raw, err := json.Marshal(struct {
		NextSeq uint64           `json:"next_seq"`
		Device  []hicache.PageID `json:"device"`
		Host    []hicache.PageID `json:"host"`
		Storage []hicache.PageID `json:"storage"`
	}{seq, held[hicache.TierDevice], held[hicache.TierHost], held[hicache.TierStorage]})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.dump, name), raw, 0o644)
}
