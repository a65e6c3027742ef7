package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRefusedPagesByCause: the text report and the JSON break the refused prefetch pages
// down by cause; Add sums replicas' counts.
func TestRefusedPagesByCause(t *testing.T) {
	var by RefusedPages
	by.Add(RefusedPages{NoRoom: 5, Quota: 1})
	by.Add(RefusedPages{NoRoom: 2, TreeChanged: 3, Duplicate: 4, Lost: 6, NotAsked: 7})
	require.Equal(t, RefusedPages{NoRoom: 7, Quota: 1, TreeChanged: 3, Duplicate: 4, Lost: 6, NotAsked: 7}, by)
	r := &Report{Storage: "file:///x", InputTokens: 100, PrefetchRefusedPages: 28, PrefetchRefusedBy: by}
	var text strings.Builder
	r.WriteText(&text)
	assert.Contains(t, text.String(), "28 stored pages refused")
	assert.Contains(t, text.String(), "refused by cause     no L2 room 7, quota 1, tree changed 3, duplicate 4, lost before prefill 6, storage not asked 7")
	var js bytes.Buffer
	require.NoError(t, r.WriteJSON(&js))
	var got struct {
		By map[string]int64 `json:"prefetch_refused_by_cause"`
	}
	require.NoError(t, json.Unmarshal(js.Bytes(), &got))
	assert.Equal(t, map[string]int64{"no_l2_room": 7, "quota": 1, "tree_changed": 3, "duplicate": 4, "lost": 6, "not_asked": 7}, got.By)
}
