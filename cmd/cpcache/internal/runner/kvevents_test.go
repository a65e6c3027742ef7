package runner

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvevents"
	"github.com/cpcache/cpcache/hicache/metrics"
)

// quietSource is an event source that publishes nothing.
type quietSource struct{ ch chan hicache.EventBatch }

func (s quietSource) Subscribe(uint64) (<-chan hicache.EventBatch, func(), error) {
	return s.ch, func() { close(s.ch) }, nil
}
func (quietSource) EventsSince(uint64) ([]hicache.EventBatch, error) { return nil, nil }
func (quietSource) NextEventSeq() (uint64, error)                    { return 0, nil }

// TestKVEventMetrics: the publishing rank's kv-event families pass the Prometheus linter and
// docs/reference.md's metrics table lists them.
func TestKVEventMetrics(t *testing.T) {
	pub, err := kvevents.Start(quietSource{make(chan hicache.EventBatch)}, kvevents.Options{
		Endpoint: "inproc://runner-kv-metrics", ReplayEndpoint: "inproc://runner-kv-metrics-replay", Linger: -1})
	require.NoError(t, err)
	defer pub.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.PublisherCollectors(pub, prometheus.Labels{"rank": "0"})...)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	fams, err := reg.Gather()
	require.NoError(t, err)
	doc, err := os.ReadFile("../../../../docs/reference.md")
	require.NoError(t, err)
	assert.Len(t, fams, 6)
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
		assert.True(t, strings.Contains(string(doc), "| `"+f.GetName()), "docs/reference.md's metrics table lacks %s", f.GetName())
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `(cpcache_run_kv_event_[a-z0-9_]+)").FindAllStringSubmatch(string(doc), -1) {
		assert.True(t, exported[m[1]], "docs/reference.md's metrics table lists %s, which the publisher does not export", m[1])
	}
}

// TestKVEventOptions: the cache keeps no event ring without a replay socket, and one bounded
// by a quarter of the history's bytes with one.
func TestKVEventOptions(t *testing.T) {
	c := DefaultConfig()
	c.KVEvents = "tcp://*:5557"
	assert.Equal(t, hicache.EventOptions{Enabled: true, NoRing: true}, c.kvEventOptions())
	c.KVEventsReplay = "tcp://*:5558"
	assert.Equal(t, hicache.EventOptions{Enabled: true, Ring: 1024, RingBytes: 16 << 20}, c.kvEventOptions())
}
