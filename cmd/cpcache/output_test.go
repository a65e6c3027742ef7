package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJSONToRedirectedStdout: `cpcache run --json /dev/stdout > FILE` leaves the text
// report and the JSON report in FILE, one after the other, as it does through a pipe: the
// stream is opened again through /dev/stdout, at offset 0, so it must be opened to append and
// not truncated, or the text report written before is lost.
func TestJSONToRedirectedStdout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	j := newJobEnv(t)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	require.NoError(t, err)
	defer out.Close()
	cmd := j.command(append([]string{"run", "--world", "2", "--dp", "1", "--attn-cp", "2", "--json", "/dev/stdout"}, smallSynthetic...)...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = out, &stderr
	require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())
	b, err := os.ReadFile(out.Name())
	require.NoError(t, err)
	text, report, found := strings.Cut(string(b), "\n{")
	require.True(t, found, "no JSON report after the text; the file holds:\n%s", b)
	require.Contains(t, text, "cpcache run report", "the text report went")
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte("{"+report), &rep), "the JSON report")
}
