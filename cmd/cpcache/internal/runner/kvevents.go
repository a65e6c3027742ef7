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
// [...], "storage": [...]}, page ids in hex), and after its n-th flush by --fault flush the
// same with "next_seq", the seq of the first batch after the flush's (replica-<d>-flush-<n>.json,
// from 1): for tests that rebuild them from the events.
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
	pub     *kvevents.Publisher
	dp      int
	dump    string
	flushes int // dumps written after flushes
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
