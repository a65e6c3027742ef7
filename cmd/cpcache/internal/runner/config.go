package runner

import (
	"errors"
	"fmt"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
)

// ErrBadInput is wrapped by every error about the run's configuration or input (a layout
// that does not divide, an unreadable or corrupt trace, capacities too small for a request):
// `cpcache run` exits with status 2 for them.
var ErrBadInput = errors.New("runner: bad input")

// Workload kinds.
const (
	WorkloadSynthetic = "synthetic"
	WorkloadTrace     = "trace"
)

// Isolation modes (--isolation): which requests may share cached pages.
const (
	IsolationNone      = "none"       // every request under the empty key: equal prefixes share
	IsolationPerClient = "per-client" // synthetic: each conversation under a key of its own
	IsolationPerTenant = "per-tenant" // trace: each line's "tenant" field is its key
)

// Config is one run's configuration; every rank of a job must use the same one.
type Config struct {
	Layout          parallel.LayoutConfig // EP 0 means the world size
	PageSize        int                   // tokens per page
	L1Pages         int                   // L1 pages of each rank (its device KV pool)
	L2Pages         int                   // L2 pages of each slab (one slab per CP rank)
	Policy          hicache.Policy        // write policy
	KVBytesPerToken int                   // bytes of KV one rank holds per token (its shard; 0 with Model: the model's)
	BatchTokens     int                   // prefill token budget of one scheduler step
	MaxRunning      int                   // requests decoding at once per replica
	// Model is the KV layout (--model): a kvlayout preset's name or its textual form ("":
	// opaque pages of KVBytesPerToken). Prepare sets KVBytesPerToken from it (one rank's
	// bytes at the layout's attention-TP size); a KVBytesPerToken of another value is bad
	// input.
	Model string
	// Engine is what does the compute (--engine): EngineKVTest ("" too: every page's bytes
	// are kvtest's function of its identity, and every page loaded back is checked against
	// it) or EngineModel (the reference transformer, sim/refmodel, computes on every rank
	// over the cache's per-layer L1, and every request's output is compared with the same
	// request computed without the cache). EngineModel sets Model to the reference model's
	// KV layout (ModelVariant) and needs attention-TP 1 and a host run.
	Engine string
	// ModelVariant is the reference model's variant with EngineModel (--model-variant):
	// "gqa" ("" too: per layer a sharded K and V part), "mla" (one replicated latent part)
	// or "side" (GQA with a replicated indexer-key side buffer).
	ModelVariant string
	// SeparateL2 (--separate-l2) keeps one L2 slab per rank even when every part of Model is
	// replicated across attention-TP (job.Config.SeparateSlabs): attention-TP copies of every
	// page, as before the TP ranks of a CP index shared one slab.
	SeparateL2 bool
	// L2Layout is how the L2 slabs arrange a page's chunks (--l2-layout): L2PageFirst ("" too:
	// a page holds every layer, the storage value) or L2LayerFirst (a slab holds each layer of
	// all its pages together); layer_first needs --model.
	L2Layout string
	// L1Buffers is how a run with --model lays out its L1 (--l1-buffers): per layer and part
	// one buffer indexed by token slot (L1TokenSlot, the default with --model: SGLang's pool;
	// device memory with --device cuda) or, on a host run, per layer one block-major tensor
	// holding every part (L1BlockMajor: vLLM's).
	L1Buffers string

	Workload  string                   // WorkloadSynthetic or WorkloadTrace
	Synthetic workload.SyntheticConfig // WorkloadSynthetic
	TracePath string                   // WorkloadTrace: Mooncake JSONL
	// TraceScale divides the trace's lengths (--trace-scale; 0 or 1: as written): every
	// input and output length and the 512 tokens of a hash id (workload.TraceOptions.Scale),
	// so that a run whose engine computes every token (--engine model) serves a slice of a
	// real trace, its sharing kept, in seconds.
	TraceScale int
	Requests   int // serve only the first N requests (0: all)
	// Isolation assigns each request an isolation key (see assignIsolation): IsolationNone
	// ("" too), IsolationPerClient or IsolationPerTenant.
	Isolation string

	// L3: Storage is the URL of a page store below L2 (file:///dir or
	// redis://host:port/prefix; "": none). With it every replica backs its L2 pages up there
	// and prefetches a prompt's continuation from it before the prefill (see doc.go).
	Storage        string
	PrefetchPolicy hicache.PrefetchPolicy // when a prefetch stops waiting (default best-effort)
	// PrefetchAlways reads every stored continuation, even where the cost model computes it
	// faster than storage reads it (by default those are skipped for cost: see
	// vtime.CostModel.PrefetchCost).
	PrefetchAlways bool
	StorageClear   bool // clear the run's namespace in Storage before serving
	// StorageTimeout bounds each storage call (0: hicache's default, 2s); a call past it
	// opens the storage circuit (see hicache.L3Options.CallTimeout).
	StorageTimeout time.Duration
	// StorageKeyFile names the file of the storage's MAC key ("": CPCACHE_STORAGE_KEY_FILE,
	// else a file store's own key file); StorageInsecure lets a Redis storage run without
	// one (see storage.Options).
	StorageKeyFile  string
	StorageInsecure bool

	// Memory (see device.go): Device is DeviceHost (default) or DeviceCUDA; with DeviceCUDA,
	// L2 is L2Device (CUDA IPC device slabs, the default) or L2Host (pinned host slabs) and
	// CUDADevice the device ordinal (-1: LOCAL_RANK mod the device count).
	Device     string
	L2         string
	CUDADevice int

	Time TimeConfig // virtual time and its cost model (see sim/vtime)

	Store     string        // rendezvous store URL ("": CPCACHE_STORE)
	Consensus string        // consensus backend: "", auto, shm or gloo (see parallel/shm)
	Timeout   time.Duration // bound of every collective (0: 5 minutes)

	// KV events (see package hicache/kvevents): KVEvents is the ZMQ PUB endpoint each DP
	// replica's rank 0 publishes on, in vLLM's format (replica d: the port plus d); "": none.
	// KVEventsReplay is the replay (ROUTER) endpoint, numbered the same way; "": none (and
	// no history kept). KVEventsHistoryMiB bounds the replay history of each publisher.
	KVEvents           string
	KVEventsReplay     string
	KVEventsHistoryMiB int

	Faults []Fault // --fault: failures to inject (see FaultHelp)
	Strict bool    // --strict: a divergence fails the run (exit 1) instead of quarantine and recovery

	// StartFlags are the command line's flags that every rank of the job must share, as it
	// gave them (cmd/cpcache: every flag of `cpcache run` but the per-rank ones). The ranks
	// compare them, with what the run makes of the flags it knows (startFlags), before
	// anything is built: a rank started with another value of any of them fails every rank
	// with ErrBadInput naming the flag and both values.
	StartFlags []StartFlag
}

// DefaultConfig is `cpcache run` without flags: CP8 DP2 EP16 with DP attention on 16 ranks
// and the built-in synthetic workload.
func DefaultConfig() Config {
	return Config{
		Layout:             parallel.LayoutConfig{World: 16, DP: 2, AttnCP: 8, EP: 0, DPAttention: true},
		PageSize:           16,
		L1Pages:            1024,
		L2Pages:            3072,
		Policy:             hicache.WriteThrough,
		KVBytesPerToken:    512,
		BatchTokens:        8192,
		MaxRunning:         16,
		Workload:           WorkloadSynthetic,
		Synthetic:          DefaultSynthetic,
		CUDADevice:         -1,
		KVEventsHistoryMiB: 64,
	}
}

// DefaultSynthetic is the workload of DefaultConfig: 96 conversations of 16 turns, 1536
// requests of up to 7 K tokens, about 6 M prompt tokens. Each DP replica serves 48
// conversations: their histories (about 22 K pages at the end) overflow the 1024 L1 pages
// many times and fit in the 3072 × 8 L2 pages of a CP group, so most prompts are served
// from L2. It takes about 26 s on 2 shared cores with 16 ranks.
var DefaultSynthetic = workload.SyntheticConfig{Clients: 96, Rounds: 16, SystemTokens: 256, QuestionTokens: 384, AnswerTokens: 64, Seed: 1}

// ModelSynthetic and ModelL1Pages are the workload and L1 of `cpcache run --engine model`
// where --clients, --rounds and --l1-pages are not given: the reference model computes every
// token on every rank and merges each layer's attention over the CP group, so the default
// run (1536 requests) would take hours. 16 conversations of 4 turns (64 requests of up to
// 512 tokens, each turn's prompt holding the previous turn's generated answer) over 16 L1
// pages per rank serve prefixes from L1 and from L2 in about a minute on 2 cores.
var (
	ModelSynthetic = workload.SyntheticConfig{Clients: 16, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 16, Seed: 1}
	ModelL1Pages   = 16
)

// resolveModel parses Config.Model (nil, nil without one) and sets KVBytesPerToken to one
// rank's bytes per token of it at attention-TP attnTP; an explicit KVBytesPerToken of
// another value is bad input naming both.
func (c *Config) resolveModel(attnTP int) (*kvlayout.Layout, error) {
	if c.Model == "" {
		return nil, nil
	}
	kv, err := kvlayout.Parse(c.Model)
	if err != nil {
		return nil, bad("--model %s: %w", c.Model, err)
	}
	bpt, err := kv.BytesPerToken(attnTP)
	if err != nil {
		return nil, bad("--model %s at attention-TP %d: %w", c.Model, attnTP, err)
	}
	if bpt > MaxKVBytesPerToken {
		return nil, bad("--model %s holds %d bytes per token per rank at attention-TP %d, over the limit of %d", c.Model, bpt, attnTP, MaxKVBytesPerToken)
	}
	if c.KVBytesPerToken != 0 && int64(c.KVBytesPerToken) != bpt {
		return nil, bad("--model %s holds %d bytes per token per rank at attention-TP %d, --kv-bytes-per-token is %d", c.Model, bpt, attnTP, c.KVBytesPerToken)
	}
	c.KVBytesPerToken = int(bpt)
	return &kv, nil
}

// PageBytes is the size of one L1 or L2 page of one rank.
func (c *Config) PageBytes() int { return c.PageSize * c.KVBytesPerToken }

// Plan is a validated configuration with its layout and workload.
type Plan struct {
	Config   Config
	Layout   *parallel.Layout
	Requests []workload.Request
	Desc     string // the workload, for the report
	// KVLayout is Config.Model's layout (nil without one).
	KVLayout *kvlayout.Layout
	// Warnings are what Prepare's checks found worth saying without refusing the run (a
	// storage directory that group or others can write); the caller prints them.
	Warnings []string
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadInput}, args...)...)
}

// Prepare validates cfg, builds the layout, loads the workload and checks that every
// request fits the capacities. Every error wraps ErrBadInput and names the bad value.
func Prepare(cfg Config) (*Plan, error) {
	lc := cfg.Layout
	if lc.EP == 0 {
		lc.EP = lc.World
	}
	layout, err := parallel.NewLayout(lc)
	if err != nil {
		return nil, bad("layout: %v", err)
	}
	cfg.Layout = lc
	if err := cfg.checkEngine(layout); err != nil {
		return nil, err
	}
	kv, err := cfg.resolveModel(layout.AttnTP)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout < 0 {
		return nil, bad("timeout %v is negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"page size", cfg.PageSize}, {"L1 pages", cfg.L1Pages}, {"L2 pages", cfg.L2Pages},
		{"KV bytes per token", cfg.KVBytesPerToken}, {"batch tokens", cfg.BatchTokens}, {"max running", cfg.MaxRunning}} {
		if v.v <= 0 {
			return nil, bad("%s %d must be positive", v.name, v.v)
		}
	}
	if cfg.Requests < 0 {
		return nil, bad("requests %d is negative", cfg.Requests)
	}
	if err := cfg.checkBounds(); err != nil {
		return nil, err
	}
	if err := cfg.checkStore(); err != nil {
		return nil, err
	}
	if int64(cfg.PageSize)*int64(cfg.KVBytesPerToken) > 1<<30 {
		return nil, bad("page of %d tokens × %d bytes is over 1 GiB", cfg.PageSize, cfg.KVBytesPerToken)
	}
	switch cfg.Consensus {
	case "", "auto", "shm", "gloo":
	default:
		return nil, bad("consensus backend %q (want auto, shm or gloo)", cfg.Consensus)
	}
	if cfg.StorageTimeout < 0 {
		return nil, bad("storage timeout %v is negative", cfg.StorageTimeout)
	}
	if g := cfg.Synthetic.TurnGapMs; g != 0 {
		switch {
		case cfg.Workload != WorkloadSynthetic:
			return nil, bad("--turn-gap %v is for --workload synthetic (a trace has its own arrival times)", time.Duration(g)*time.Millisecond)
		case cfg.Time.Mode == TimeNone:
			return nil, bad("--turn-gap %v needs --time virtual (under --time none every request is served from 0)", time.Duration(g)*time.Millisecond)
		}
	}
	if err := cfg.Time.normalize(cfg.Workload, cfg.Synthetic.TurnGapMs > 0); err != nil {
		return nil, err
	}
	layers := 0 // opaque pages load whole
	if kv != nil {
		layers = kv.NumLayers // loads copy layer 0 first: each layer's compute overlaps the next layer's copy
	}
	if cfg.Time.Model, err = cfg.Time.Cost.Resolve(layout.AttnCP, layout.AttnTP, cfg.PageSize, cfg.KVBytesPerToken, layers); err != nil {
		return nil, bad("%w", err)
	}
	if err := cfg.checkDevice(); err != nil {
		return nil, err
	}
	if err := cfg.checkKVMemory(); err != nil {
		return nil, err
	}
	p := &Plan{Config: cfg, Layout: layout, KVLayout: kv}
	switch cfg.Workload {
	case WorkloadSynthetic:
		if cfg.TracePath != "" {
			return nil, bad("--trace %s needs --workload trace", cfg.TracePath)
		}
		if cfg.TraceScale != 0 && cfg.TraceScale != 1 {
			return nil, bad("--trace-scale %d needs --workload trace", cfg.TraceScale)
		}
		p.Requests, err = workload.Synthetic(cfg.Synthetic)
		if err != nil {
			return nil, bad("%v", err)
		}
		if cfg.Requests > 0 && cfg.Requests < len(p.Requests) {
			p.Requests = p.Requests[:cfg.Requests]
		}
		s := cfg.Synthetic
		p.Desc = fmt.Sprintf("synthetic: %d clients × %d rounds (system %d, question %d, answer %d tokens), %d requests",
			s.Clients, s.Rounds, s.SystemTokens, s.QuestionTokens, s.AnswerTokens, len(p.Requests))
		if s.TurnGapMs > 0 {
			p.Desc += fmt.Sprintf(", a turn every %v per conversation", time.Duration(s.TurnGapMs)*time.Millisecond)
		}
	case WorkloadTrace:
		if cfg.TracePath == "" {
			return nil, bad("--workload trace needs --trace FILE")
		}
		p.Requests, err = workload.ReadTraceFile(cfg.TracePath, workload.TraceOptions{MaxRequests: cfg.Requests, Scale: cfg.TraceScale})
		if errors.Is(err, workload.ErrBadScale) {
			return nil, bad("--trace-scale: %v", err)
		}
		if err != nil {
			return nil, bad("--trace: %v", err)
		}
		p.Desc = fmt.Sprintf("trace %s, %d requests", cfg.TracePath, len(p.Requests))
		if cfg.TraceScale > 1 {
			p.Desc += fmt.Sprintf(", lengths scaled 1/%d", cfg.TraceScale)
		}
	default:
		return nil, bad("workload %q (want %s or %s)", cfg.Workload, WorkloadSynthetic, WorkloadTrace)
	}
	if err := p.assignIsolation(); err != nil {
		return nil, err
	}
	if m := cfg.Isolation; m != "" && m != IsolationNone {
		p.Desc += ", isolation " + m
	}
	if err := p.checkArrivals(); err != nil {
		return nil, err
	}
	if err := p.checkCapacity(); err != nil {
		return nil, err
	}
	if err := p.checkStorage(); err != nil {
		return nil, err
	}
	if err := p.checkKVEvents(); err != nil {
		return nil, err
	}
	if be := cfg.Time.Model.BreakEven(); cfg.Storage != "" {
		if w := be.Warning(cfg.Time.Cost.Name); w != "" {
			p.Warnings = append(p.Warnings, w)
		}
	}
	if err := p.checkFaultRanks(); err != nil {
		return nil, err
	}
	return p, nil
}

// assignIsolation gives every request its isolation key under Config.Isolation: none, the
// empty key (every request may hit every other's prefix); per-client, "client-N" for the
// synthetic workload's conversation N (a shared system prompt is then cached once per
// client, and no client's timing shows another's prompts); per-tenant, the trace line's
// "tenant" field, which every line must then have (a Mooncake trace has none: the flag is
// refused for it, naming the first request without one).
func (p *Plan) assignIsolation() error {
	mode := p.Config.Isolation
	switch mode {
	case "", IsolationNone:
		for i := range p.Requests {
			p.Requests[i].Key = ""
		}
		return nil
	case IsolationPerClient:
		if p.Config.Workload != WorkloadSynthetic {
			return bad("--isolation %s needs --workload %s (a trace has no clients; per-tenant reads a trace's \"tenant\" field)", mode, WorkloadSynthetic)
		}
		for i := range p.Requests {
			p.Requests[i].Key = fmt.Sprintf("client-%d", p.Requests[i].Client)
		}
		return nil
	case IsolationPerTenant:
		if p.Config.Workload != WorkloadTrace {
			return bad("--isolation %s needs --workload %s with a \"tenant\" field on every line (the synthetic workload has clients: per-client)", mode, WorkloadTrace)
		}
		for i := range p.Requests {
			r := &p.Requests[i]
			if r.Tenant == "" {
				return bad("--isolation %s: request %d of the trace has no \"tenant\" field (or an empty one); every line needs one", mode, r.ID)
			}
			r.Key = "tenant-" + r.Tenant
		}
		return nil
	default:
		return bad("--isolation %q (want %s, %s or %s)", mode, IsolationNone, IsolationPerClient, IsolationPerTenant)
	}
}

// maxArrivalNs bounds a request's arrival on the virtual clock (about 146 years), which
// counts int64 nanoseconds: past it the clock's arithmetic overflows.
const maxArrivalNs = 1 << 62

// checkArrivals rejects, with virtual time, a request that arrives past what the virtual
// clock can count (a trace timestamp of centuries in ms, or a tiny --speed): its times
// would wrap around into nonsense in the report.
func (p *Plan) checkArrivals() error {
	t := &p.Config.Time
	if t.Mode != TimeVirtual {
		return nil
	}
	for _, r := range p.Requests {
		if ns := float64(r.ArrivalMs) * 1e6 / t.Speed; ns > maxArrivalNs {
			return bad("request %d arrives at %d ms, at speed %g past the %.0f years virtual time can count", r.ID, r.ArrivalMs, t.Speed, maxArrivalNs/1e9/3600/24/365.25)
		}
	}
	return nil
}

// pagesOf is the number of L1 pages a request occupies at most (see sched.Config.PagesOf).
func (c *Config) pagesOf(r workload.Request) int {
	sc := c.sched()
	return sc.PagesOf(r)
}

// checkCapacity rejects capacities too small to hold the largest request: L1 must hold all
// of its pages (each rank's pool the pages it owns, rank 0 the most), and the slabs of one CP group its pages in L2 (page i lives in the slab of
// CP rank i mod attn_cp).
func (p *Plan) checkCapacity() error {
	c := &p.Config
	biggest := 0
	for i, r := range p.Requests {
		if c.pagesOf(r) > c.pagesOf(p.Requests[biggest]) {
			biggest = i
		}
	}
	r := p.Requests[biggest]
	need := c.pagesOf(r)
	cp := p.Layout.AttnCP
	if perRank := (need + cp - 1) / cp; perRank > c.L1Pages {
		return bad("L1 pages %d cannot hold request %d: %d prompt + %d output tokens need %d pages of %d tokens, %d of them on CP rank 0",
			c.L1Pages, r.ID, len(r.Tokens), r.OutputLen, need, c.PageSize, perRank)
	}
	if perSlab := (need + cp - 1) / cp; perSlab > c.L2Pages {
		return bad("L2 pages %d per slab cannot hold request %d: its %d pages need %d in each of the %d slabs of a CP group",
			c.L2Pages, r.ID, need, perSlab, cp)
	}
	return nil
}

// Route is the DP replica (attention-DP index) that serves req: a synthetic request goes
// to replica client mod attn_dp, so every turn of a conversation meets its history; a trace
// request to a hash of its first block (up to block tokens: workload.BlockTokens, or fewer
// at a --trace-scale) mod attn_dp, so requests that share a first block — a common prefix —
// meet in one replica's cache.
func Route(l *parallel.Layout, req workload.Request, block int) int {
	if l.AttnDP <= 1 {
		return 0
	}
	if req.Client >= 0 {
		return req.Client % l.AttnDP
	}
	n := min(len(req.Tokens), block)
	h := uint64(14695981039346656037)
	for _, t := range req.Tokens[:n] {
		h = (h ^ uint64(uint32(t))) * 1099511628211
	}
	return int(h % uint64(l.AttnDP))
}

// traceBlockTokens is the tokens behind one hash id of the plan's trace (at its
// --trace-scale).
func (p *Plan) traceBlockTokens() int { return workload.BlockTokens / max(p.Config.TraceScale, 1) }

// ReplicaRequests are the requests replica dp serves, in workload order.
func (p *Plan) ReplicaRequests(dp int) []workload.Request {
	var out []workload.Request
	for _, r := range p.Requests {
		if Route(p.Layout, r, p.traceBlockTokens()) == dp {
			out = append(out, r)
		}
	}
	return out
}

// SharesL2 reports whether the plan's attention-TP ranks of a CP index share one L2 slab
// (job.SharesSlabs: every part of the model replicated, attention-TP > 1, no --separate-l2).
func (p *Plan) SharesL2() bool { return job.SharesSlabs(p.Layout, p.KVLayout, p.Config.SeparateL2) }

// KVShard is the tensor-parallel shard of rank tp's KV content: 0 on every rank when the
// slabs are shared (the same bytes on every TP rank), else tp.
func (p *Plan) KVShard(tp int) int {
	if p.SharesL2() {
		return 0
	}
	return tp
}

// l2Memory is the report's account of the job's L2: copies of each page, bytes holding one
// sequence page, and every slab's bytes.
func (p *Plan) l2Memory() report.L2Memory {
	l, c := p.Layout, &p.Config
	copies, slabs := l.AttnTP, l.Config.World
	if p.SharesL2() {
		copies, slabs = 1, l.AttnDP*l.AttnCP
	}
	return report.L2Memory{Shared: p.SharesL2(), Copies: copies, Slabs: slabs,
		BytesPerPage: int64(copies) * int64(c.PageBytes()), Bytes: int64(slabs) * int64(c.L2Pages) * int64(c.PageBytes())}
}

// kvLayoutReport is the report's account of the plan's KV layout (nil without one).
func (p *Plan) kvLayoutReport() *report.KVLayout {
	if p.KVLayout == nil {
		return nil
	}
	c := &p.Config
	return &report.KVLayout{Name: c.Model, Spec: p.KVLayout.String(),
		BytesPerToken: int64(c.KVBytesPerToken), PageBytes: int64(c.PageBytes()),
		Layers: p.KVLayout.NumLayers, Parts: len(p.KVLayout.Parts), L2Layout: c.L2Layout, L1: c.l1Kind()}
}
