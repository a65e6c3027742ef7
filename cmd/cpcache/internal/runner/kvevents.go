package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
)

// EnvKVEventsDump names a directory where each replica's publishing rank writes, after its
// last step, the pages its cache holds per tier (replica-<d>.json: {"device": [...], "host":
// [...], "storage": [...]}, chained hashes): for tests that rebuild them from the events.
const EnvKVEventsDump = "CPCACHE_KV_EVENTS_DUMP"

// checkKVEvents refuses --kv-events-replay without --kv-events, and endpoints that cannot
// be numbered for the last replica, before any rank starts.
func (p *Plan) checkKVEvents() error {
	c := &p.Config
	if c.KVEvents == "" {
		if c.KVEventsReplay != "" {
			return bad("--kv-events-replay %s needs --kv-events", c.KVEventsReplay)
		}
		return nil
	}
	last := p.Layout.AttnDP - 1
	if _, err := kvevents.OffsetEndpoint(c.KVEvents, last); err != nil {
		return bad("--kv-events %q: %v", c.KVEvents, err)
	}
	if _, err := kvevents.OffsetEndpoint(c.KVEventsReplay, last); err != nil {
		return bad("--kv-events-replay %q: %v", c.KVEventsReplay, err)
	}
	return nil
}

type kvPublisher struct {
	pub  *kvevents.Publisher
	dp   int
	dump string
}

// startKVEvents publishes replica dp's events on its endpoints (see Config.KVEvents).
func startKVEvents(cache *hicache.Cache, cfg *Config, dp, rank int) (*kvPublisher, error) {
	ep, err := kvevents.OffsetEndpoint(cfg.KVEvents, dp)
	if err != nil {
		return nil, bad("--kv-events: %v", err)
	}
	replay, err := kvevents.OffsetEndpoint(cfg.KVEventsReplay, dp)
	if err != nil {
		return nil, bad("--kv-events-replay: %v", err)
	}
	pub, err := kvevents.Start(cache, kvevents.Options{Endpoint: ep, ReplayEndpoint: replay,
		Log: func(err error) { fmt.Fprintf(os.Stderr, "cpcache: rank %d: %v\n", rank, err) }})
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
		held := cache.HeldPages()
		raw, err := json.Marshal(map[string][]uint64{"device": held[hicache.TierDevice], "host": held[hicache.TierHost], "storage": held[hicache.TierStorage]})
		if err == nil {
			err = os.WriteFile(filepath.Join(p.dump, fmt.Sprintf("replica-%d.json", p.dp)), raw, 0o644)
		}
		dumpErr = err
	}
	return errors.Join(p.pub.Close(), dumpErr)
}
