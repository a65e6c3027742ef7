package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/storage/stores"
)

// The end-to-end tests run a cpcache binary built once without the race detector: up to 16
// rank processes under -race would be slow on a 2-core machine. The in-process scheduler
// tests in internal/runner run under -race.
var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func cpcacheBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "cpcache-run-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "cpcache")
		// Linked as the Makefile links it, with the VERSION file's version.
		out, err := exec.Command("go", "build", "-ldflags", "-X github.com/cpcache/cpcache/internal/version.version="+repoVersion(t), "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

// withoutLauncherEnv is this process's environment without a launcher's or a parent run's
// variables, nor those alsoDrop (nil: none) names.
func withoutLauncherEnv(alsoDrop func(name string) bool) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == runner.EnvStatusDir || name == runner.EnvCorruptRank || slices.Contains(launcherVars, name) ||
			alsoDrop != nil && alsoDrop(name) {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// runBinary runs `cpcache run args...` with the launcher's variables removed; it returns
// the exit status, the report (when --json was written) and stderr.
func runBinary(t *testing.T, env []string, args ...string) (int, *report.Report, string, string) {
	t.Helper()
	return startBinary(t, env, args...)()
}

// startBinary starts `cpcache run args...` (see runBinary) and returns a function that waits
// for it and returns what runBinary returns.
func startBinary(t *testing.T, env []string, args ...string) func() (int, *report.Report, string, string) {
	t.Helper()
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(cpcacheBinary(t), append([]string{"run", "--json", jsonPath}, args...)...)
	cmd.Env = append(withoutLauncherEnv(nil), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	return func() (int, *report.Report, string, string) {
		t.Helper()
		err := cmd.Wait()
		status := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			status = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		var rep *report.Report
		if b, err := os.ReadFile(jsonPath); err == nil {
			rep = &report.Report{}
			require.NoError(t, json.Unmarshal(b, rep))
		}
		return status, rep, stdout.String(), stderr.String()
	}
}

// requireHealthy asserts what every good run must show.
func requireHealthy(t *testing.T, status int, rep *report.Report, stdout, stderr string) {
	t.Helper()
	requireSound(t, status, rep, stdout, stderr)
	assert.Equal(t, repoVersion(t), rep.Version, "the report carries the binary's version")
	assert.Equal(t, rep.SchedulerSteps, rep.ConsensusSteps)
	assert.Positive(t, rep.DigestChecks)
	assert.Equal(t, rep.PagesLoadedL2, rep.PagesVerified, "every page loaded back is verified")
	assert.Positive(t, rep.PagesWrittenL2)
}

// requireSound asserts what every finished run shows, whatever its engine: exit status 0, a
// text and a JSON report, no bad page, no digest mismatch, one consensus collective per
// scheduler step, and every prompt token counted once (hit in a tier or missed).
func requireSound(t *testing.T, status int, rep *report.Report, stdout, stderr string) {
	t.Helper()
	require.Equal(t, 0, status, "stderr:\n%s", stderr)
	require.NotNil(t, rep, "no JSON report; stderr:\n%s", stderr)
	assert.Contains(t, stdout, "cpcache run report (cpcache "+repoVersion(t)+")")
	assert.Zero(t, rep.BadPages)
	assert.Zero(t, rep.DigestMismatches)
	assert.Equal(t, 1.0, rep.CollectivesPerStep, "exactly one consensus collective per scheduler step")
	assert.Equal(t, rep.InputTokens, rep.TokensHitL1+rep.TokensHitL2+rep.TokensHitL3+rep.TokensMissed)
}

// smallSynthetic repeats each conversation's history beyond L1: 8 conversations of 4 turns
// (up to 128 pages each) through 128 L1 pages.
var smallSynthetic = []string{"--clients", "8", "--rounds", "4", "--l1-pages", "160", "--l2-pages", "512", "--kv-bytes-per-token", "64"}

// l1For is --l1-pages for an L1 of 160 pages of the tree (smallSynthetic's) at CP size cp:
// each rank's pool holds only the pages it owns. A later flag overrides smallSynthetic's.
func l1For(cp int) []string { return []string{"--l1-pages", strconv.Itoa(160 / cp)} }

func TestRunCP8DP2On16Ranks(t *testing.T) {
	status, rep, out, errOut := runBinary(t, nil, append(append([]string{"--world", "16", "--dp", "2", "--attn-cp", "8"}, smallSynthetic...), l1For(8)...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Contains(t, rep.Layout, "attn_dp=2 attn_tp=1")
	assert.Equal(t, int64(32), rep.Requests)
	assert.Positive(t, rep.TokensHitL2, "histories evicted from L1 must come back from L2")
	assert.Equal(t, "shm", rep.ConsensusBackend)
}

// TestRunModel: --model sets the pages' size from a KV layout (DeepSeek-V3's MLA latent:
// 61 layers × 1152 bytes per token on every rank; Llama-3-8B's K and V), the ranks lend
// per-layer L1 buffers in either L2 layout, wait for load-backs layer by layer, and the report
// states the layout, the L1 and the L2 layout.
func TestRunModel(t *testing.T) {
	status, rep, out, errOut := runBinary(t, nil, "--world", "2", "--attn-cp", "2", "--dp", "1", "--clients", "4", "--rounds", "2",
		"--model", "deepseek-v3", "--l1-pages", "48", "--l2-pages", "128")
	requireHealthy(t, status, rep, out, errOut)
	require.NotNil(t, rep.KVLayout)
	assert.Positive(t, rep.KVLayout.LayerWaits)
	assert.Zero(t, rep.KVLayout.LayerWaits%61, "every load-back waits for each of the 61 layers")
	assert.Equal(t, report.KVLayout{Name: "deepseek-v3", Spec: "layers=61;kv=1152:replicated", BytesPerToken: 61 * 1152, PageBytes: 16 * 61 * 1152,
		Layers: 61, Parts: 1, L2Layout: "page_first", L1: "host, per layer and part a token-slot buffer", LayerWaits: rep.KVLayout.LayerWaits}, *rep.KVLayout)
	assert.Contains(t, out, "  kv layout            deepseek-v3 (70272 B/token per rank, 1124352 B/page)\n")
	assert.Contains(t, out, "  kv memory            L1 host, per layer and part a token-slot buffer; L2 page_first; 61 layers × 1 parts = 61 chunks of a page\n")

	// Llama-3-8B at CP 2 (2 MiB pages): a small run in each L2 layout.
	for _, lay := range []string{"page_first", "layer_first"} {
		status, rep, out, errOut := runBinary(t, nil, "--world", "2", "--attn-cp", "2", "--dp", "1", "--clients", "3", "--rounds", "2",
			"--model", "llama-3-8b", "--l2-layout", lay, "--l1-pages", "48", "--l2-pages", "160")
		requireHealthy(t, status, rep, out, errOut)
		require.NotNil(t, rep.KVLayout, lay)
		assert.Equal(t, lay, rep.KVLayout.L2Layout)
		assert.Positive(t, rep.PagesLoadedL2, "%s: pages came back from L2", lay)
		assert.Positive(t, rep.KVLayout.LayerWaits, lay)
		assert.Contains(t, out, "  kv layout            llama-3-8b (131072 B/token per rank, 2097152 B/page)\n", lay)
		assert.Contains(t, out, "; L2 "+lay+"; 32 layers × 2 parts = 64 chunks of a page\n", lay)
	}
}

// TestRunModelSharedL2: --model deepseek-v3 at attention-TP 2 × CP 2 in four processes: the
// TP ranks of a CP index share one slab (two slabs for the job, made by the TP-0 ranks over
// the replica group), every rank verifies what it loads, and the report says so.
func TestRunModelSharedL2(t *testing.T) {
	status, rep, out, errOut := runBinary(t, nil, "--world", "4", "--attn-cp", "2", "--dp", "1", "--clients", "4", "--rounds", "2",
		"--model", "deepseek-v3", "--l1-pages", "56", "--l2-pages", "128")
	requireHealthy(t, status, rep, out, errOut)
	assert.Contains(t, rep.Layout, "attn_tp=2")
	page := int64(16 * 61 * 1152)
	assert.Equal(t, report.L2Memory{Shared: true, Copies: 1, BytesPerPage: page, Slabs: 2, Bytes: 2 * 128 * page}, rep.L2)
	assert.Contains(t, out, "(slabs: 2, attention-TP ranks share a slab)")
	assert.Positive(t, rep.PagesVerified)
}

func TestRunCP8On8Ranks(t *testing.T) {
	status, rep, out, errOut := runBinary(t, nil, append(append([]string{"--world", "8", "--dp", "1", "--attn-cp", "8"}, smallSynthetic...), l1For(8)...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Positive(t, rep.TokensHitL2)
}

func TestRunTP4On4RanksOverGloo(t *testing.T) {
	status, rep, out, errOut := runBinary(t, nil, append([]string{"--world", "4", "--dp", "1", "--attn-cp", "1", "--consensus", "gloo"}, smallSynthetic...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Contains(t, rep.Layout, "attn_tp=4")
	assert.Equal(t, "gloo", rep.ConsensusBackend)
	assert.Positive(t, rep.TokensHitL2)
}

func TestRunTraceReplay(t *testing.T) {
	trace := filepath.Join("..", "..", "..", "shared", "data", "traces", "synthetic_trace.jsonl")
	if _, err := os.Stat(trace); err != nil {
		t.Skipf("public trace not available at %s: %v", trace, err)
	}
	args := []string{"--world", "8", "--dp", "2", "--attn-cp", "4", "--workload", "trace", "--trace", trace,
		"--requests", "200", "--page-size", "64", "--l1-pages", "1536", "--kv-bytes-per-token", "16"}
	hit := map[string]float64{}
	for _, l2 := range []string{"512", "8192"} {
		status, rep, out, errOut := runBinary(t, nil, append(args, "--l2-pages", l2)...)
		requireHealthy(t, status, rep, out, errOut)
		assert.Equal(t, int64(200), rep.Requests)
		hit[l2] = rep.HitRate
		if l2 == "8192" {
			assert.Positive(t, rep.TokensHitL2, "repeated prefixes beyond L1 must hit in L2")
		}
	}
	assert.Greater(t, hit["8192"], hit["512"], "a larger L2 keeps more repeated prefixes")
}

func TestRunJoinsAnotherLaunchersJob(t *testing.T) {
	// Under a launcher (here cpcache launch, as under mpirun or torchrun) every process is one
	// rank, --world comes from the launcher, and rank 0 prints the report itself.
	bin := cpcacheBinary(t)
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	args := append([]string{"launch", "-n", "4", "--", bin, "run", "--dp", "1", "--attn-cp", "4", "--json", jsonPath}, smallSynthetic...)
	cmd := exec.Command(bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err, stderr.String())
	var rep report.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	requireHealthy(t, 0, &rep, stdout.String(), stderr.String())
	assert.Contains(t, stdout.String(), "[0] cpcache run report")
	assert.NotContains(t, stdout.String(), "[1] cpcache run report", "only rank 0 reports")
	assert.Contains(t, rep.Layout, "world=4 ")
}

func TestRunDetectsACorruptL2Page(t *testing.T) {
	status, rep, _, errOut := runBinary(t, []string{runner.EnvCorruptRank + "=2"},
		append([]string{"--world", "4", "--dp", "1", "--attn-cp", "4"}, smallSynthetic...)...)
	assert.Equal(t, 1, status, errOut)
	require.NotNil(t, rep, errOut)
	assert.Positive(t, rep.BadPages)
	assert.Regexp(t, `rank 2: request \d+: page \d+ loaded from L2 is wrong`, errOut)
}

func TestRunBadInputExitsTwoBeforeLaunching(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt.jsonl")
	require.NoError(t, os.WriteFile(corrupt, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}`+"\n{oops\n"), 0o600))
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "trace", "--trace", filepath.Join(dir, "missing.jsonl")}, "missing.jsonl"},
		{[]string{"--workload", "trace", "--trace", corrupt}, "line 2"},
		{[]string{"--workload", "trace"}, "needs --trace"},
		{[]string{"--workload", "zipf"}, `workload "zipf"`},
		{[]string{"--turn-gap", "1.5ms"}, "--turn-gap 1.5ms: must be whole milliseconds from 0 to 1h0m0s"},
		{[]string{"--turn-gap", "-2s"}, "--turn-gap -2s: must be whole milliseconds"},
		{[]string{"--turn-gap", "2s", "--time", "none"}, "--turn-gap 2s needs --time virtual"},
		{[]string{"--world", "12"}, "attn-cp 8"},
		{[]string{"--world", "16", "--attn-cp", "3"}, "not divisible by attn-cp 3"},
		{[]string{"--l1-pages", "8"}, "L1 pages 8 cannot hold request"},
		{[]string{"--l2-pages", "2"}, "L2 pages 2 per slab cannot hold request"},
		{[]string{"--page-size", "0"}, "page size 0"},
		{[]string{"--policy", "write_sometimes"}, `write policy "write_sometimes"`},
		{[]string{"--consensus", "carrier-pigeon"}, `consensus backend "carrier-pigeon"`},
		{[]string{"--metrics", "bad-address"}, "bad-address"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--storage", "ftp://host/pages"}, `unknown scheme "ftp"`},
		{[]string{"--storage", "redis://127.0.0.1:99999/x"}, `port "99999"`},
		{[]string{"--storage", "file://relative/dir"}, `file URL host "relative"`},
		{[]string{"--storage", "redis://127.0.0.1:" + closedPort(t) + "/x", "--storage-insecure"}, "storage: redis"},
		{[]string{"--storage", "redis://127.0.0.1:" + closedPort(t) + "/x"}, "needs a MAC key"},
		{[]string{"--storage", "redis://127.0.0.1:6379/x", "--storage-key-file", filepath.Join(dir, "none")}, "none read: bad argument: open: no such file"},
		{[]string{"--storage-clear"}, "--storage-clear needs --storage"},
		{[]string{"--storage-insecure"}, "--storage-insecure needs --storage"},
		{[]string{"--kv-events-replay", "tcp://*:5558"}, "--kv-events-replay tcp://*:5558 needs --kv-events"},
		{[]string{"--kv-events", "tcp://host"}, `--kv-events "tcp://host": kvevents: endpoint "tcp://host" has no port`},
		{[]string{"--prefetch-policy", "timeout"}, "--prefetch-policy timeout needs --storage"},
		{[]string{"--isolation", "per-user"}, `--isolation "per-user" (want none, per-client or per-tenant)`},
		{[]string{"--model", "llama-9"}, `--model llama-9: kvlayout: unknown preset "llama-9" (known: deepseek-v3, llama-3-70b, llama-3-8b, llama-3-8b-indexer)`},
		{[]string{"--model", "llama-3-8b", "--kv-bytes-per-token", "512"}, "--model llama-3-8b holds 131072 bytes per token per rank at attention-TP 1, --kv-bytes-per-token is 512"},
		{[]string{"--model", "llama-3-8b", "--l2-layout", "layers_first"}, `--l2-layout "layers_first" (want page_first or layer_first)`},
		{[]string{"--l2-layout", "layer_first"}, "--l2-layout layer_first needs --model"},
		{[]string{"--isolation", "per-tenant"}, "--isolation per-tenant needs --workload trace"},
		{[]string{"--fault", "flush:step=5,when=later"}, "when=later: want now or idle"},
		{[]string{"--timeout", "-1s"}, "timeout -1s is negative"},
		{[]string{"--json", filepath.Join(dir, "r.out"), "--html", filepath.Join(dir, ".", "r.out")}, "are the same file"},
		{[]string{"--storage", "mem://pages"}, "mem:// storage lives in one process"},
		{[]string{"--storage", "file://" + dir, "--prefetch-policy", "eventually"}, `prefetch policy "eventually"`},
	}
	for _, c := range cases {
		status, out, errOut := runCmd(append([]string{"run"}, c.args...)...)
		assert.Equal(t, 2, status, "%v: %s", c.args, errOut)
		assert.Empty(t, out, c.args)
		assert.Contains(t, errOut, c.want, c.args)
		assert.NotContains(t, errOut, "starting", "%v: no rank may start", c.args)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		assert.Len(t, lines, 1, "%v: one line: %q", c.args, errOut)
	}
}

// closedPort is a loopback TCP port nothing listens on (it was free a moment ago).
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(l.Addr().String())
	require.NoError(t, l.Close())
	return port
}

// storageArgs: one replica of CP4 (no other replica to share the system prompt through
// storage), 8 conversations whose histories overflow L1 and fit in L2, so that a first run
// against an empty storage never needs it.
var storageArgs = append([]string{"--world", "4", "--dp", "1", "--attn-cp", "4"}, smallSynthetic...)

// requireSecondRunHitsStorage runs the same job twice against url: the first run backs its
// pages up and hits nothing in storage; the second (fresh L1 and L2) prefetches the
// histories from it, verified page by page.
func requireSecondRunHitsStorage(t *testing.T, url string, extra ...string) {
	t.Helper()
	args := append(append([]string{"--storage", url}, storageArgs...), extra...)
	var reps [2]*report.Report
	for i := range reps {
		status, rep, out, errOut := runBinary(t, nil, args...)
		requireHealthy(t, status, rep, out, errOut)
		assert.Contains(t, out, "tokens hit in storage")
		assert.Zero(t, rep.StorageErrors, "run %d: %s", i+1, errOut)
		assert.Equal(t, rep.PagesLoadedL2, rep.PagesVerified, "run %d: every page loaded (prefetched ones too) is verified", i+1)
		reps[i] = rep
	}
	first, second := reps[0], reps[1]
	assert.Zero(t, first.TokensHitL3, "the first run finds nothing it needs in an empty storage")
	assert.Positive(t, first.PagesBackedUp, "the first run backs its L2 pages up")
	assert.Positive(t, second.TokensHitL3, "the second run hits storage for what the first backed up")
	assert.Positive(t, second.PagesPrefetched)
	assert.Greater(t, second.HitRate, first.HitRate)
	assert.Less(t, second.TokensMissed, first.TokensMissed)
}

func TestRunTwiceSharesFileStorage(t *testing.T) {
	dir := t.TempDir()
	requireSecondRunHitsStorage(t, "file://"+dir)
	fi, err := os.Stat(filepath.Join(dir, stores.DirKeyFile))
	require.NoError(t, err, "the first run creates the store's MAC key beside it")
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	// Another page size in bytes is another namespace: it never reads those pages.
	status, rep, out, errOut := runBinary(t, nil, append(append([]string{"--storage", "file://" + dir}, storageArgs...), "--kv-bytes-per-token", "32")...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Zero(t, rep.TokensHitL3, "pages of another KV size are not this run's")
	// --storage-clear empties this run's namespace first: nothing to hit.
	status, rep, out, errOut = runBinary(t, nil, append([]string{"--storage", "file://" + dir, "--storage-clear"}, storageArgs...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Zero(t, rep.TokensHitL3, "the storage was cleared before serving")
}

func TestRunTwiceSharesRedisStorage(t *testing.T) {
	srv := redistest.Start(t) // skips, saying why, without redis-server
	keyFile := filepath.Join(t.TempDir(), "key")
	_, err := stores.LoadOrCreateKeyFile(keyFile)
	require.NoError(t, err)
	requireSecondRunHitsStorage(t, srv.URL("cpcache-run-test"), "--prefetch-policy", "wait-complete", "--storage-key-file", keyFile)
}
