package main

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMetricsLingerServesFinalFiguresUntilInterrupted: with --metrics-linger forever the
// endpoint outlives the run (after the report) with the final figures — every request done,
// scrapable with curl — and a SIGINT then ends the process with the run's status, 0.
func TestMetricsLingerServesFinalFiguresUntilInterrupted(t *testing.T) {
	bin := cpcacheBinary(t)
	cmd := exec.Command(bin, append([]string{"run", "--world", "2", "--dp", "1", "--attn-cp", "2",
		"--metrics", "127.0.0.1:0", "--metrics-linger", "forever"}, smallSynthetic...)...)
	cmd.Env = withoutLauncherEnv(nil)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	report := make(chan string, 1)
	go func() { b, _ := io.ReadAll(stdout); report <- string(b) }()

	over := regexp.MustCompile(`^metrics: the run is over; (http://\S+/metrics) serves its final figures until interrupted`)
	url := ""
	lines := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(4*time.Minute, func() { cmd.Process.Kill() }) // bounded: no run takes this long
	defer deadline.Stop()
	for url == "" && lines.Scan() {
		if m := over.FindStringSubmatch(lines.Text()); m != nil {
			url = m[1]
		}
	}
	require.NotEmpty(t, url, "no line saying the metrics linger")
	go io.Copy(io.Discard, stderr)
	resp, err := http.Get(url)
	require.NoError(t, err, "the endpoint after the run")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// 8 conversations of 4 turns: 32 requests, all done, summed over the replica's leader.
	require.Regexp(t, `(?m)^cpcache_run_requests_done_total\{[^}]*rank="0"[^}]*\} 32$`, string(body))

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("after SIGINT in the linger: exit %d, want the run's 0", ee.ExitCode())
	}
	require.NoError(t, err)
	require.True(t, strings.Contains(<-report, "cpcache run report"), "the report came before the linger")
}
