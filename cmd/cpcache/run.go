package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/internal/sigpipe"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
)

func init() {
	register(command{name: "run", summary: "serve a workload through the cache on a world of ranks and report (the main job)", run: runRun})
}

const runDescription = `Serves a request workload through the hierarchical cache on a world of ranks over Gloo
groups and host shared-memory L2 slabs, verifies every page loaded back from L2, and
prints a report (rank 0). Without flags: CP8 DP2 EP16 with DP attention on 16 local ranks
and the built-in synthetic multi-turn workload.

Without launcher variables it starts --world ranks of itself on this machine (like
cpcache launch, with a temporary file store); under mpirun or torchrun (RANK or
OMPI_COMM_WORLD_RANK set) it runs as one rank of their job, and --world defaults to the
launcher's world size.

Requests go to DP replicas by client mod attn_dp (synthetic) or by a hash of the first
trace block (512 tokens, 512/N at --trace-scale N) mod attn_dp (trace).

With --storage URL (file:///dir, redis://host:port/prefix, or a Redis Cluster,
redis+cluster://host:port,host:port/prefix) the cache gets an L3 tier:
every replica backs its L2 pages up to the storage and, when a prompt continues beyond its
L1 and L2 hit, prefetches the continuation from it while the request waits in the queue and
the others keep running (--prefetch-sync: wait instead, in steps where nothing decodes).
Pages live in a namespace of the page size, KV bytes and attention-TP size,
so runs of another shape never read them; a second run against the same storage hits what
the first one backed up. Stored pages are authenticated with a MAC key: a file store makes
its own (DIR/.cpcache-storage-key), a redis:// storage needs --storage-key-file (or
CPCACHE_STORAGE_KEY_FILE), the same on every rank, or --storage-insecure. The report adds
tokens hit in storage, pages prefetched and backed up, storage errors, and stored pages
rejected (and deleted) or forged. file:///dir?max_bytes=64GiB bounds the store (least
recently used pages go, a chain's later ones first; shared by every job that opens it so),
&ttl=1h drops pages unused for an hour; the report counts the evictions. A divergence of the replicas' cache metadata quarantines
the cache and recovers at the first idle step (the report counts divergences, recoveries
and quarantined steps); --strict fails the run instead.

With --device cuda each rank's L1 pool is device memory and pages move through the CUDA
engine (streams, batched copies); --l2 device (the default) puts the L2 slabs in device
memory shared between the rank processes over CUDA IPC (so the ranks of a CP group must be
on one node), --l2 host in pinned host shared memory. Every page loaded back is copied to
the host and checked. Rank r uses device LOCAL_RANK mod the device count (--cuda-device N:
device N); several ranks may share one GPU. The report adds the devices, the memory kinds
and the page-copy bandwidth against a large copy's.

--time virtual (the default for traces) replays arrival times on a simulated clock that
advances by each step's modelled duration (--cost-profile, --cost); nothing sleeps. The
report adds TTFT, queueing and throughput in virtual time with the cache on and off, every
missed token by cause, and reference hit rates (unlimited capacity; an LRU of 512-token
blocks, or the trace's scaled blocks, of the same capacity). --sweep PARAM=V1,V2,... runs once per value and prints one
table; --html FILE writes a self-contained HTML report with charts.

Inputs are checked before any rank starts (exit 2): at most 256 local ranks (and what
RLIMIT_NPROC allows), sizes within their limits, the memory the local ranks need within
what the host has available (MemAvailable and every cgroup v1 or v2 limit above this
process), every trace line within its limits, --store reachable, --json and --html
writable, --fault well formed. Under a launcher the ranks compare every flag but the
per-rank ones (--cuda-device, --store, --timeout, --trace's path, --storage-key-file's path,
--json, --html, --metrics, --metrics-linger) before anything is built: a difference is exit
2 on every rank naming the flag and both values. --trace, --cost-profile, --json and --html must be regular
files (the reports may also go to /dev/stdout, /dev/stderr or /dev/null): a named pipe, a
directory or a device is refused at once. Ranks die with the process that started them; the
temporary directory goes with the job. A rank that has ended its part but is not reaped within 3s
(a thread of it stuck in the kernel: a frozen or hung file system) is left behind with a
warning, and the report is printed without it. Exit status: 0 ok, 1 failure (a bad page, a
divergence under --strict, a lost rank), 2 bad flags or input, 128+signal when
interrupted by SIGINT, SIGTERM or SIGHUP (130 for SIGINT; the signal is passed on to the
ranks, which end cleanly).

` + runner.FaultHelp

// runOpts are the flags of `cpcache run`.
type runOpts struct {
	cfg                       runner.Config
	layout                    *parallel.LayoutConfig // copied into cfg after parsing
	jsonPath, metrics, policy string
	prefetch                  string
	report                    reportOpts    // virtual time, sweep and HTML (run_report.go)
	faults                    string        // --fault, parsed into cfg.Faults
	metricsLinger             lingerFlag    // --metrics-linger
	turnGap                   time.Duration // --turn-gap, copied into cfg.Synthetic.TurnGapMs
	fs                        *flag.FlagSet // the flags, to tell which were given
}

// lingerFlag is --metrics-linger: how long /metrics stays up after the run, a duration or
// "forever" (until SIGINT or SIGTERM).
type lingerFlag struct {
	d       time.Duration
	forever bool
}

func (l *lingerFlag) String() string {
	if l.forever {
		return "forever"
	}
	return l.d.String()
}

func (l *lingerFlag) Set(s string) error {
	if s == "forever" {
		*l = lingerFlag{forever: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 30s, or forever")
	}
	*l = lingerFlag{d: d}
	return nil
}

func (l lingerFlag) set() bool { return l.forever || l.d > 0 }

func runFlags(fs *flag.FlagSet) *runOpts {
	def := runner.DefaultConfig()
	o := &runOpts{cfg: def, fs: fs}
	cfg := &o.cfg
	o.layout = layoutFlags(fs, def.Layout)
	// run's EP 0 is the world (runner.Config.Layout), not layout's and collective-bench's 1.
	fs.Lookup("ep").Usage = "expert-parallel size (0: the world)"
	fs.IntVar(&cfg.PageSize, "page-size", def.PageSize, "tokens per page")
	fs.IntVar(&cfg.L1Pages, "l1-pages", def.L1Pages, "L1 (device KV pool) pages of each rank")
	fs.IntVar(&cfg.L2Pages, "l2-pages", def.L2Pages, "L2 pages of each slab (one slab per CP rank)")
	fs.StringVar(&o.policy, "policy", def.Policy.String(), "write policy: write_through, write_through_selective or write_back")
	fs.IntVar(&cfg.KVBytesPerToken, "kv-bytes-per-token", def.KVBytesPerToken, "bytes of KV one rank holds per token (its shard); with --model: the model's, and another value is an error")
	fs.StringVar(&cfg.Model, "model", "", "the KV layout: a preset ("+strings.Join(kvlayout.PresetNames(), ", ")+") or layers=N;name=bytes:sharded|replicated;... (bytes per token of the whole part); sets --kv-bytes-per-token to one rank's share at the attention-TP size, is compared across ranks and keys the storage namespace")
	fs.StringVar(&cfg.Engine, "engine", runner.EngineKVTest, "what computes the KV: kvtest (every page's bytes a function of its identity, every page loaded back checked) or model (the reference transformer of sim/refmodel computes on every rank, reading cached prefixes from the per-layer L1, and every request's generated tokens and final logits are compared with the same request computed without the cache; sets --model to the reference model's KV layout; needs attention-TP 1 and --device host; unless --clients, --rounds or --l1-pages are given, it serves 16 conversations of 4 turns of up to 512 tokens over 16 L1 pages per rank, since the model computes every token)")
	fs.StringVar(&cfg.ModelVariant, "model-variant", "", "the reference model with --engine model: gqa (the default; per layer a sharded K and V part), mla (one replicated latent part per layer) or side (GQA with a replicated indexer-key side buffer)")
	fs.BoolVar(&cfg.SeparateL2, "separate-l2", false, "keep one L2 slab per rank even when every part of --model is replicated across attention-TP (MLA); by default the attention-TP ranks of a CP index then share one slab, one L2 copy per CP group")
	fs.IntVar(&cfg.BatchTokens, "batch-tokens", def.BatchTokens, "prefill token budget of one scheduler step")
	fs.IntVar(&cfg.MaxRunning, "max-running", def.MaxRunning, "requests decoding at once in each DP replica")
	fs.StringVar(&cfg.Workload, "workload", def.Workload, "synthetic or trace")
	fs.StringVar(&cfg.TracePath, "trace", "", "Mooncake JSONL trace (--workload trace)")
	fs.IntVar(&cfg.TraceScale, "trace-scale", 1, "--workload trace: divide every input and output length and the 512 tokens of a hash id by N, a power of two up to 512 (requests keep their blocks and their sharing at 1/N of the size: --engine model serves a slice of a real trace in seconds)")
	fs.IntVar(&cfg.Requests, "requests", 0, "serve only the first N requests (0: all)")
	fs.StringVar(&cfg.Isolation, "isolation", "none", "isolation key of each request: none (equal prefixes share pages), per-client (each synthetic conversation its own key: no cross-client hits) or per-tenant (a trace's \"tenant\" field, which every line must have)")
	fs.IntVar(&cfg.Synthetic.Clients, "clients", def.Synthetic.Clients, "synthetic: conversations")
	fs.IntVar(&cfg.Synthetic.Rounds, "rounds", def.Synthetic.Rounds, "synthetic: turns of each conversation")
	fs.DurationVar(&o.turnGap, "turn-gap", 0, "synthetic: each conversation asks its next turn this long after the last (virtual time; the clients evenly staggered over one gap; implies --time virtual); 0: every turn arrives at once")
	fs.StringVar(&cfg.Storage, "storage", "", "L3 page storage below L2: file:///dir (a local or shared filesystem) redis://host:port/prefix or a Redis Cluster, redis+cluster://host:port,host:port/prefix (shared across machines); default none")
	fs.BoolVar(&o.cfg.PrefetchAlways, "prefetch-always", false, "with --storage: read every stored continuation, even where the cost profile computes it faster than storage reads it (for comparison)")
	fs.StringVar(&o.prefetch, "prefetch-policy", "best-effort", "with --storage: when a prefetch from storage stops: best-effort, wait-complete or timeout")
	fs.DurationVar(&cfg.StorageTimeout, "storage-timeout", 0, "with --storage: bound on each storage call; a call past it opens the storage circuit (default 2s)")
	fs.BoolVar(&cfg.StorageClear, "storage-clear", false, "with --storage: remove this run's pages (its namespace) from the storage before serving")
	fs.StringVar(&cfg.StorageKeyFile, "storage-key-file", "", "with --storage: file holding the MAC key that authenticates stored pages (mode 0600; the same on every rank); default CPCACHE_STORAGE_KEY_FILE, else a file store's own key file (created on first use)")
	fs.BoolVar(&cfg.StorageInsecure, "storage-insecure", false, "with a redis:// --storage and no key: accept unauthenticated pages (anyone who can write to the server can inject them)")
	fs.StringVar(&cfg.KVEvents, "kv-events", "", "publish each DP replica's KV events (pages stored and removed per tier) in vLLM's format on this ZMQ PUB endpoint, e.g. tcp://*:5557 (bound; a host name: connected); replica d uses the port plus d")
	fs.StringVar(&cfg.KVEventsReplay, "kv-events-replay", "", "with --kv-events: the ZMQ ROUTER endpoint that replays missed batches (bound; replica d: the port plus d); without it no history is kept")
	fs.IntVar(&cfg.KVEventsHistoryMiB, "kv-events-history-mib", def.KVEventsHistoryMiB, "with --kv-events-replay: MiB of encoded batches each publisher keeps for replay (the oldest leave first)")
	fs.StringVar(&cfg.Device, "device", runner.DeviceHost, "where L1 lives and who copies: host (host memory, goroutines) or cuda (device memory, the CUDA engine; needs libcuda)")
	fs.StringVar(&cfg.L2Layout, "l2-layout", runner.L2PageFirst, "how the L2 slabs arrange a page: page_first (a page holds every layer, the storage value) or layer_first (a slab holds each layer of all its pages together; needs --model); compared across ranks")
	fs.StringVar(&cfg.L1Buffers, "l1-buffers", "", "with --model, the L1's buffers: token_slot (per layer and part one buffer indexed by token slot, as SGLang; the default; on the device with --device cuda) or block_major (per layer one tensor of every part, as vLLM; host runs)")
	fs.StringVar(&cfg.L2, "l2", "", "with --device cuda: L2 slabs in device memory shared over CUDA IPC (device, the default) or in pinned host memory (host)")
	fs.IntVar(&cfg.CUDADevice, "cuda-device", def.CUDADevice, "with --device cuda: the device ordinal of every rank (-1: LOCAL_RANK mod the device count)")
	fs.StringVar(&cfg.Store, "store", "", "rendezvous store URL (file:///dir or redis://host:port); default: CPCACHE_STORE, else a temporary directory")
	fs.StringVar(&cfg.Consensus, "consensus", "", "consensus backend: auto (shared memory when a replica is on one host), shm or gloo; default CPCACHE_CONSENSUS_BACKEND, else auto")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "deadline of rendezvous and of the final report gather (0: 5m); a consensus step waits at most 1m")
	fs.StringVar(&o.jsonPath, "json", "", "also write the report as JSON to this file")
	fs.StringVar(&o.metrics, "metrics", "", "serve Prometheus metrics at this address (host:port) while running")
	fs.Var(&o.metricsLinger, "metrics-linger", "with --metrics: keep /metrics up after the run, with the final figures, for this long (30s) or forever (until Ctrl-C); the run's exit status is kept")
	fs.StringVar(&o.faults, "fault", "", "inject failures: KIND[:PARAM=VALUE,...][;...] (see above)")
	fs.BoolVar(&cfg.Strict, "strict", false, "a divergence of the replicas fails the run (exit 1) instead of quarantine and recovery")
	o.report.flags(fs)
	return o
}

func runRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "[flags]", runDescription, stderr)
	o := runFlags(fs)
	if status, done := parseFlags(fs, args); done {
		return status
	}
	if fs.NArg() > 0 {
		return fail(stderr, 2, fmt.Errorf("run: unexpected argument %q", fs.Arg(0)))
	}
	if err := o.finish(); err != nil {
		return fail(stderr, 2, fmt.Errorf("run: %w", err))
	}
	cfg := &o.cfg
	cfg.StartFlags = agreedFlags(fs)
	worldSet, cudaDeviceSet := false, false
	fs.Visit(func(f *flag.Flag) {
		worldSet = worldSet || f.Name == "world"
		cudaDeviceSet = cudaDeviceSet || f.Name == "cuda-device"
	})
	if cudaDeviceSet && cfg.Device != runner.DeviceCUDA {
		return fail(stderr, 2, fmt.Errorf("run: --cuda-device %d needs --device %s", cfg.CUDADevice, runner.DeviceCUDA))
	}
	statusDir := os.Getenv(runner.EnvStatusDir)
	joined := parallel.UnderLauncher()
	localRanks := cfg.Layout.World
	if joined {
		if env, err := parallel.FromEnv(); err == nil {
			localRanks = env.LocalWorldSize
			if !worldSet && statusDir == "" {
				cfg.Layout.World = env.WorldSize
			}
		}
	} else if err := checkLocalRanks("--world", cfg.Layout.World); err != nil {
		return fail(stderr, 2, fmt.Errorf("run: %w", err))
	}
	if o.jsonPath != "" && o.report.html != "" && sameFile(o.jsonPath, o.report.html) {
		return fail(stderr, 2, fmt.Errorf("run: --json %s and --html %s are the same file: one report would overwrite the other", o.jsonPath, o.report.html))
	}
	// The ranks of `cpcache run` itself were checked by the process that started them.
	checkHere := statusDir == ""
	if checkHere && o.jsonPath != "" {
		if err := checkOutputFile("--json", o.jsonPath); err != nil {
			return fail(stderr, 2, fmt.Errorf("run: %w", err))
		}
	}
	if checkHere && o.report.html != "" {
		if err := checkOutputFile("--html", o.report.html); err != nil {
			return fail(stderr, 2, fmt.Errorf("run: %w", err))
		}
	}
	if o.report.sweep != "" {
		if joined {
			return fail(stderr, 2, errors.New("run: --sweep starts its own ranks once per value: run it without a launcher"))
		}
		return runSweep(o, args, stdout, stderr)
	}
	plan, err := runner.Prepare(*cfg)
	if err != nil {
		return fail(stderr, 2, fmt.Errorf("run: %w", err))
	}
	if checkHere {
		if err := plan.CheckHost(localRanks); err != nil {
			return fail(stderr, 2, fmt.Errorf("run: %w", err))
		}
		// This process starts every rank: a machine without a driver or a device is told
		// here, once, instead of by each rank after it started. Under another launcher the
		// ranks agree on the failure at their first collective.
		if !joined && cfg.Device == runner.DeviceCUDA {
			if err := checkCUDA(); err != nil {
				return fail(stderr, 2, fmt.Errorf("run: --device %s: %w (cpcache gpu-info shows what this machine has)", runner.DeviceCUDA, err))
			}
		}
		for _, w := range plan.Warnings {
			fmt.Fprintf(stderr, "cpcache: warning: %s\n", w)
		}
	}
	ctx, signalled := signalContext()
	paths := reportPaths{json: o.jsonPath, html: o.report.html}
	status := 0
	if joined {
		status = runAsRank(ctx, plan, statusDir, paths, o.metrics, stdout, stderr)
	} else {
		var lingered bool
		status, lingered = runLocal(ctx, plan, args, o.metrics, o.metricsLinger, stdout, stderr, func(rep *report.Report) int {
			if err := emitReport(rep, paths, stdout); err != nil {
				return fail(stderr, 1, err)
			}
			return 0
		})
		if lingered { // a signal that ends --metrics-linger ends no run
			return status
		}
	}
	if sig := signalled(); sig != 0 {
		return 128 + int(sig)
	}
	return status
}

// signalContext returns a context cancelled by the first SIGINT, SIGTERM or SIGHUP, and a
// function that returns that signal (0: none yet). The job then exits with 128+signal, 130
// for a Ctrl-C, like a shell. SIGHUP (a closed terminal or ssh session, or a launcher passing
// it on) ends the job as SIGTERM does, instead of killing this process on the spot.
func signalContext() (context.Context, func() syscall.Signal) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var got atomic.Int32
	go func() {
		s := <-sigs
		got.Store(int32(s.(syscall.Signal)))
		cancel()
	}()
	return ctx, func() syscall.Signal { return syscall.Signal(got.Load()) }
}

// finish checks the flags that need parsing and copies them into the configuration.
func (o *runOpts) finish() error {
	cfg := &o.cfg
	cfg.Layout = *o.layout
	p, err := hicache.ParsePolicy(o.policy)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	cfg.Policy = p
	if cfg.PrefetchPolicy, err = runner.ParsePrefetchPolicy(o.prefetch); err != nil {
		return fmt.Errorf("--prefetch-policy: %w", err)
	}
	if o.turnGap < 0 || o.turnGap > workload.MaxTurnGapMs*time.Millisecond || o.turnGap%time.Millisecond != 0 {
		return fmt.Errorf("--turn-gap %v: must be whole milliseconds from 0 to %v", o.turnGap, workload.MaxTurnGapMs*time.Millisecond)
	}
	cfg.Synthetic.TurnGapMs = o.turnGap.Milliseconds()
	set := map[string]bool{}
	o.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if (cfg.Model != "" || cfg.Engine == runner.EngineModel) && !set["kv-bytes-per-token"] {
		cfg.KVBytesPerToken = 0 // the model's (runner.Prepare)
	}
	if cfg.Engine == runner.EngineModel {
		model := runner.ModelSynthetic
		model.TurnGapMs = cfg.Synthetic.TurnGapMs
		if set["clients"] {
			model.Clients = cfg.Synthetic.Clients
		}
		if set["rounds"] {
			model.Rounds = cfg.Synthetic.Rounds
		}
		cfg.Synthetic = model
		if !set["l1-pages"] {
			cfg.L1Pages = runner.ModelL1Pages
		}
	}
	if o.faults != "" {
		if cfg.Faults, err = runner.ParseFaults(o.faults); err != nil {
			return err
		}
	}
	if strings.HasPrefix(cfg.Storage, "mem:") {
		return fmt.Errorf("--storage %s: a mem:// storage lives in one process and its ranks are separate processes (use file:///dir or redis://host:port/prefix)", redact.URL(cfg.Storage))
	}
	return o.report.apply(cfg)
}

// runAsRank runs this process as one rank of a job started by a launcher.
func runAsRank(ctx context.Context, p *runner.Plan, statusDir string, paths reportPaths, metrics string, stdout, stderr io.Writer) int {
	out := runner.Output{StatusDir: statusDir}
	if statusDir == "" {
		out.Progress, out.Terminal, out.MetricsAddr = stderr, runner.IsTerminal(os.Stderr) && stderr == io.Writer(os.Stderr), metrics
	}
	rep, err := runner.RunRank(ctx, p, out)
	if rep != nil && statusDir == "" {
		if werr := emitReport(rep, paths, stdout); werr != nil {
			return fail(stderr, 1, werr)
		}
	}
	if err != nil {
		if errors.Is(err, runner.ErrBadInput) {
			return fail(stderr, 2, fmt.Errorf("run: %w", err))
		}
		return fail(stderr, 1, fmt.Errorf("run: %w", err))
	}
	return 0
}

// runLocal starts the world as local ranks of this binary, draws their progress, hands rank
// 0's report (if the ranks left one) to emit, and returns the exit status. With metrics and
// linger it then keeps /metrics up, with the ranks' final figures, for linger or until ctx
// ends; lingered says the run was over before ctx ended.
func runLocal(ctx context.Context, p *runner.Plan, args []string, metrics string, linger lingerFlag, stdout, stderr io.Writer,
	emit func(*report.Report) int) (status int, lingered bool) {
	_, status = startRanks(ctx, p, args, metrics, stdout, stderr, func(w *runner.Watcher, rep *report.Report, status int) int {
		if rep != nil {
			if s := emit(rep); s != 0 && status == 0 {
				status = s
			}
		}
		if w.MetricsAddr() == "" || !linger.set() || ctx.Err() != nil {
			return status
		}
		lingered = true
		var timeout <-chan time.Time
		until := "until interrupted (Ctrl-C)"
		if !linger.forever {
			timeout = time.After(linger.d)
			until = "for " + linger.d.String()
		}
		fmt.Fprintf(stderr, "metrics: the run is over; http://%s/metrics serves its final figures %s\n", w.MetricsAddr(), until)
		select {
		case <-ctx.Done():
		case <-timeout:
		}
		return status
	})
	return status, lingered
}

// startRanks starts the ranks and hands after the watcher (still serving /metrics), rank 0's
// report (nil when the ranks left none) and the ranks' status; after's status is returned.
func startRanks(ctx context.Context, p *runner.Plan, args []string, metrics string, stdout, stderr io.Writer,
	after func(*runner.Watcher, *report.Report, int) int) (*report.Report, int) {
	sigpipe.Catch() // this process is the ranks' launcher, its progress and report included
	exe, err := os.Executable()
	if err != nil {
		return nil, fail(stderr, 1, fmt.Errorf("run: own executable: %w", err))
	}
	reclaimJobDirs()
	dir, done, err := newJobDir("run")
	if err != nil {
		return nil, fail(stderr, 1, fmt.Errorf("run: temporary directory: %w", err))
	}
	defer done()
	statusDir, storeDir, exitDir := filepath.Join(dir, "status"), filepath.Join(dir, "store"), filepath.Join(dir, "exit")
	for _, d := range []string{statusDir, storeDir, exitDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fail(stderr, 1, fmt.Errorf("run: %w", err))
		}
	}
	store := p.Config.Store
	if store == "" {
		store = "file://" + storeDir
	}
	w, err := runner.NewWatcher(statusDir, len(p.Requests), metrics)
	if err != nil {
		return nil, fail(stderr, 2, fmt.Errorf("run: %w", err))
	}
	defer w.Close()
	if a := w.MetricsAddr(); a != "" {
		fmt.Fprintf(stderr, "metrics: http://%s/metrics\n", a)
	}
	fmt.Fprintf(stderr, "run: %s: starting %d local ranks; %s\n", p.Layout, p.Layout.Config.World, p.Desc)
	// The ranks inherit the environment: the status directory tells them to report through
	// it instead of printing.
	if err := os.Setenv(runner.EnvStatusDir, statusDir); err != nil {
		return nil, fail(stderr, 1, err)
	}
	defer os.Unsetenv(runner.EnvStatusDir)
	l := &launcher{n: p.Layout.Config.World, argv: append([]string{exe, "run"}, args...), store: store, exitDir: exitDir,
		stdout: &lineWriter{w: stdout}, stderr: &lineWriter{w: stderr}}
	pctx, stopProgress := context.WithCancel(ctx)
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		w.Progress(pctx, stderr, stderr == io.Writer(os.Stderr) && runner.IsTerminal(os.Stderr))
	}()
	status := l.run()
	stopProgress()
	<-progressDone
	rep, rerr := runner.ReadReport(statusDir)
	if rerr != nil {
		if status == 0 {
			status = fail(stderr, 1, fmt.Errorf("run: the ranks finished without a report: %w", rerr))
		}
		rep = nil
	}
	return rep, after(w, rep, status)
}

func emitReport(rep *report.Report, paths reportPaths, stdout io.Writer) error {
	rep.WriteText(stdout)
	if err := writeOutput(paths.json, "--json", rep.WriteJSON); err != nil {
		return err
	}
	return writeOutput(paths.html, "--html", func(w io.Writer) error { return report.WriteHTML(w, rep, nil) })
}

// writeOutput writes a file with write ("" path: nothing); errors name the flag and path.
func writeOutput(path, flag string, write func(io.Writer) error) error {
	if path == "" {
		return nil
	}
	f, _, err := openOutput(flag, path)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if fi, serr := f.Stat(); serr == nil && fi.Mode().IsRegular() && !isOutputStream(path) {
		err = f.Truncate(0) // a stream redirected to a file holds what was written before
	}
	if err == nil {
		err = write(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("run: %s %s: %w", flag, path, err)
	}
	return nil
}
