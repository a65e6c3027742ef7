package kvevents

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cpcache/cpcache/hicache"
)

// TestConfigCheckNamesTheField: what no replica could publish with is a *ConfigError naming
// the field and its value, the last replica's numbering included; a good config passes.
func TestConfigCheckNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		c        Config
		replicas int
		field    string
		value    string
	}{
		{Config{Endpoint: "tcp://*:99999"}, 1, FieldEndpoint, "tcp://*:99999"},
		{Config{Endpoint: "tcp://*:65535"}, 2, FieldEndpoint, "tcp://*:65535"},
		{Config{Endpoint: "bogus://x"}, 1, FieldEndpoint, "bogus://x"},
		{Config{ReplayEndpoint: "tcp://*:5558"}, 1, FieldReplayEndpoint, "tcp://*:5558"},
		{Config{Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://host:5558"}, 1, FieldReplayEndpoint, "tcp://host:5558"},
		{Config{Endpoint: "tcp://*:5557", ReplayEndpoint: "ipc:///tmp/r"}, 2, FieldReplayEndpoint, "ipc:///tmp/r"},
		{Config{Endpoint: "tcp://*:5557", HistoryBytes: -1}, 1, FieldHistoryBytes, "-1"},
	} {
		err := tc.c.Check(tc.replicas)
		var ce *ConfigError
		if assert.True(t, errors.As(err, &ce), "%+v: %v", tc.c, err) {
			assert.Equal(t, tc.field, ce.Field, "%+v", tc.c)
			assert.Equal(t, tc.value, ce.Value, "%+v", tc.c)
			assert.Contains(t, err.Error(), tc.value)
		}
	}
	assert.NoError(t, Config{}.Check(4))
	assert.NoError(t, Config{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://*:5558"}.Check(4))
	assert.NoError(t, Config{Endpoint: "ipc:///tmp/kv", ReplayEndpoint: "ipc:///tmp/kv-replay"}.Check(1))
}

// TestConfigEventOptions: no events without an endpoint; no ring without a replay socket;
// with one, a ring of a quarter of the history's bound.
func TestConfigEventOptions(t *testing.T) {
	assert.Equal(t, hicache.EventOptions{}, Config{}.EventOptions())
	assert.Equal(t, hicache.EventOptions{Enabled: true, NoRing: true}, Config{Endpoint: "tcp://*:5557"}.EventOptions())
	assert.Equal(t, hicache.EventOptions{Enabled: true, Ring: 1024, RingBytes: DefaultHistoryBytes / 4},
		Config{Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5558"}.EventOptions())
	assert.Equal(t, hicache.EventOptions{Enabled: true, Ring: 1024, RingBytes: 1 << 20},
		Config{Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5558", HistoryBytes: 4 << 20}.EventOptions())
}
