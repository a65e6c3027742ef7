package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTextAndServe: Text renders the text exposition; Serve serves the same on /metrics (a
// port chosen for :0), refuses a bad address naming it, and Close is idempotent.
func TestTextAndServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "cpcache_test_total", Help: "A test counter.", ConstLabels: prometheus.Labels{"rank": "3"}})
	c.Add(7)
	reg.MustRegister(c)
	text, err := Text(reg)
	require.NoError(t, err)
	assert.Contains(t, string(text), "# TYPE cpcache_test_total counter\n")
	assert.Contains(t, string(text), `cpcache_test_total{rank="3"} 7`+"\n")

	srv, err := Serve("127.0.0.1:0", reg)
	require.NoError(t, err)
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(body), `cpcache_test_total{rank="3"} 7`), string(body))
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())

	_, err = Serve("nowhere", reg)
	assert.ErrorContains(t, err, `metrics address "nowhere"`)
}
