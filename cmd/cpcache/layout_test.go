package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCmd(args ...string) (status int, stdout, stderr string) {
	var out, errb bytes.Buffer
	status = run(args, &out, &errb)
	return status, out.String(), errb.String()
}

func TestLayoutJSONForCP8DP2EP16(t *testing.T) {
	status, out, errOut := runCmd("layout", "--world", "16", "--tp", "16", "--dp", "2", "--attn-cp", "8", "--ep", "16", "--dp-attention", "--json")
	require.Equal(t, 0, status, errOut)
	var got map[string][][]int
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.ElementsMatch(t, []string{"tp", "attn_tp", "attn_cp", "ep", "replica", "slab"}, keys(got))
	assert.Equal(t, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}, got["slab"])
	assert.Equal(t, got["slab"], got["replica"])
	assert.Len(t, got["attn_tp"], 16)
	assert.Len(t, got["tp"][0], 16)
}

func TestLayoutHumanOutput(t *testing.T) {
	status, out, _ := runCmd("layout", "--world", "8", "--attn-cp", "4")
	require.Equal(t, 0, status)
	assert.Contains(t, out, "attn_cp  2 group(s) of 4: [0,2,4,6] [1,3,5,7]")
}

func TestLayoutBadInputExitsTwoWithOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"layout", "--world", "8", "--attn-cp", "3"},
		{"layout", "--world", "16", "--ep", "3"},
		{"layout"},
		{"layout", "--world", "x"},
		{"nosuchcommand"},
	} {
		status, _, errOut := runCmd(args...)
		assert.Equal(t, 2, status, "%v", args)
		assert.NotEmpty(t, errOut)
		if args[0] == "layout" && len(args) > 2 && args[2] != "x" {
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		}
	}
	_, _, errOut := runCmd("layout", "--world", "8", "--attn-cp", "3")
	assert.Contains(t, errOut, "attn-cp 3")
}

func TestHelp(t *testing.T) {
	status, out, _ := runCmd("--help")
	assert.Equal(t, 0, status)
	assert.Contains(t, out, "layout")
	status, _, errOut := runCmd("layout", "--help")
	assert.Equal(t, 0, status)
	assert.Contains(t, errOut, "--dp-attention")
}

func keys(m map[string][][]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestDPAttentionDefaultIsOneForEveryCommand: layout, collective-bench and run default
// --dp-attention alike (on: dp > 1 needs it), so the same layout flags give the same layout in
// each; --dp-attention=false turns it off and dp 2 is then refused, naming the flag's cause.
func TestDPAttentionDefaultIsOneForEveryCommand(t *testing.T) {
	assert.Equal(t, runner.DefaultConfig().Layout.DPAttention, defaultLayoutFlags.DPAttention, "run's default and layout's")
	status, out, errOut := runCmd("layout", "--world", "16", "--dp", "2", "--attn-cp", "8")
	require.Equal(t, 0, status, errOut)
	assert.Contains(t, out, "dp_attention=true (attn_dp=2 attn_tp=1)")
	status, _, errOut = runCmd("layout", "--world", "16", "--dp", "2", "--attn-cp", "8", "--dp-attention=false")
	assert.Equal(t, 2, status)
	assert.Contains(t, errOut, "dp 2 needs DP attention")
}
