package runner

import (
	"errors"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/zmq"
)

// EnvKVEventsDump names a directory where each replica's publishing rank writes the pages its
// cache holds per tier after its last step and after each flush by --fault flush
// (kvevents.EnvDump): for tests that rebuild them from the events.
const EnvKVEventsDump = kvevents.EnvDump

// kvEventsConfig is the run's KV events as the shared publisher takes them (job.Config.KVEvents).
func (c *Config) kvEventsConfig() kvevents.Config {
	return kvevents.Config{Endpoint: c.KVEvents, ReplayEndpoint: c.KVEventsReplay, HistoryBytes: c.kvHistoryBytes()}
}

// checkKVEvents refuses, before any rank starts: --kv-events-replay without --kv-events,
// an endpoint that is malformed, that could not be bound where it must be, or that cannot
// be numbered for the last replica (a port pushed past 65535) (kvevents.Config.Check), a
// negative history bound, and a machine without libzmq.
func (p *Plan) checkKVEvents() error {
	c := &p.Config
	if c.KVEvents == "" {
		if c.KVEventsReplay != "" {
			return bad("--kv-events-replay %s needs --kv-events", c.KVEventsReplay)
		}
		return nil
	}
	if c.KVEventsHistoryMiB < 0 {
		return bad("--kv-events-history-mib %d is negative", c.KVEventsHistoryMiB)
	}
	var ce *kvevents.ConfigError
	if err := c.kvEventsConfig().Check(p.Layout.AttnDP); errors.As(err, &ce) {
		flag := "--kv-events"
		if ce.Field == kvevents.FieldReplayEndpoint {
			flag = "--kv-events-replay"
		}
		return bad("%s %q: %v", flag, ce.Value, ce.Err)
	} else if err != nil {
		return bad("--kv-events: %v", err)
	}
	if _, err := zmq.Open(); err != nil {
		return bad("--kv-events %s: %v", c.KVEvents, err)
	}
	return nil
}

// kvEventOptions are the cache's event options for --kv-events (kvevents.Config.EventOptions).
func (c *Config) kvEventOptions() hicache.EventOptions { return c.kvEventsConfig().EventOptions() }

// kvHistoryBytes is --kv-events-history-mib in bytes (0: kvevents' default).
func (c *Config) kvHistoryBytes() int64 {
	if c.KVEventsHistoryMiB == 0 {
		return kvevents.DefaultHistoryBytes
	}
	return int64(c.KVEventsHistoryMiB) << 20
}
