package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/cpcache/cpcache/hicache/metrics"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/internal/version"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/sim/sched"
)

// EnvStatusDir names the directory where the ranks of a job started by `cpcache run` itself
// write their status files and rank 0 its report; the starting process draws the progress,
// serves the metrics and prints the report from them. Unset under another launcher: then
// rank 0 does all of that itself.
const EnvStatusDir = "CPCACHE_RUN_STATUS_DIR"

// Output says where rank 0 shows progress and serves metrics when no status directory is
// set. Other ranks ignore it.
type Output struct {
	Progress    io.Writer // progress lines (nil: none)
	Terminal    bool      // Progress is a terminal: redraw a bar in place
	MetricsAddr string    // serve Prometheus metrics here ("": none)
	StatusDir   string    // EnvStatusDir's value ("": none)
}

// EnvCorruptRank, for tests, names a rank that damages one byte of the first L2 page it
// owns of the first node it is about to load back, so that the integrity check must fail.
const EnvCorruptRank = "CPCACHE_RUN_TEST_CORRUPT_RANK"

// rankResult is what each rank contributes to the report.
type rankResult struct {
	Rank             int                   `json:"rank"`
	DP               int                   `json:"dp"`     // its DP replica
	Leader           bool                  `json:"leader"` // rank 0 of its replica group: its sched.Counts count
	Backend          string                `json:"backend"`
	Replica          sched.Counts          `json:"replica"`
	Local            sched.Local           `json:"local"`
	PagesWritten     int64                 `json:"pages_written"`
	PagesLoaded      int64                 `json:"pages_loaded"`
	Collectives      int64                 `json:"collectives"` // on the consensus group while serving, less Flush's (local.FlushCollectives)
	DigestChecks     int64                 `json:"digest_checks"`
	DigestMismatches int64                 `json:"digest_mismatches"`
	L3Prefetched     int64                 `json:"l3_prefetched"`                // agreed in the replica: its leader's counts
	L3BackedUp       int64                 `json:"l3_backed_up"`                 // agreed in the replica: its leader's counts
	StorageErrors    int64                 `json:"storage_errors"`               // this rank's calls (each rank does its own pages' storage I/O)
	StorageRead      int64                 `json:"storage_pages_read"`           // pages this rank read from storage (its own, verified)
	StorageWritten   int64                 `json:"storage_pages_written"`        // pages this rank wrote to storage (its own)
	StorageRejected  int64                 `json:"storage_rejected"`             // stored values this rank's storage rejected (and deleted)
	StorageForged    int64                 `json:"storage_forged"`               // of them, failing authentication
	CircuitOpenSecs  float64               `json:"storage_circuit_open_seconds"` // this rank's breaker
	StorageAbandoned int64                 `json:"storage_abandoned"`            // this rank's storage operations abandoned in the kernel at their deadline
	StorageEvicted   int64                 `json:"storage_evicted"`              // values this rank's file store removed for its capacity
	StorageExpired   int64                 `json:"storage_expired"`              // values this rank's file store removed past its TTL
	Divergences      int64                 `json:"divergences"`                  // agreed in the replica
	Recoveries       int64                 `json:"recoveries"`
	QuarantinedSteps int64                 `json:"quarantined_steps"`
	CopyFailures     int64                 `json:"copy_failures"` // agreed in the replica: backups aborted and loads made stale
	LatencyNs        []int64               `json:"latency_ns"`
	WallSeconds      float64               `json:"wall_seconds"`
	Err              string                `json:"err,omitempty"` // an integrity failure on this rank
	Device           *deviceResult         `json:"device,omitempty"`
	Timing           *report.ReplicaTiming `json:"timing,omitempty"` // leaders: virtual time and miss causes
	Model            *modelResult          `json:"model,omitempty"`  // --engine model: this rank's compute
}

// modelResult is what a rank's reference model computed (--engine model).
type modelResult struct {
	Tokens     int64   `json:"tokens"`
	Seconds    float64 `json:"seconds"`
	RefTokens  int64   `json:"ref_tokens"`
	RefSeconds float64 `json:"ref_seconds"`
}

// result is what e computed (nil without an engine).
func (e *modelEngine) result() *modelResult {
	if e == nil {
		return nil
	}
	return &modelResult{Tokens: e.computed, Seconds: e.took.Seconds(), RefTokens: e.refComputed, RefSeconds: e.refTook.Seconds()}
}

// ErrIntegrity is wrapped by the error of a run that finished but found a bad page or a
// placement divergence.
var ErrIntegrity = errors.New("runner: integrity check failed")

// RunRank runs this process as one rank of the job: rank and world come from the launcher's
// environment (parallel.FromEnv), the groups are Gloo groups over the store, the consensus group
// is shared memory when its members are on one host (else Gloo), and the L2 is host
// shared-memory slabs. Rank 0 returns the report of the whole job (other ranks a nil
// report). The error wraps ErrIntegrity when the run completed but a check failed; the
// report is then still returned.
func RunRank(ctx context.Context, p *Plan, out Output) (rep *report.Report, err error) {
	start := time.Now()
	cfg := &p.Config
	env, err := parallel.FromEnv()
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	if env.WorldSize != p.Layout.Config.World {
		return nil, fmt.Errorf("%w: the launcher started %d ranks, the layout %s needs %d", ErrBadInput, env.WorldSize, p.Layout, p.Layout.Config.World)
	}
	cfg.killPoint(env.Rank, "start", 0)
	mem := &memory{cfg: cfg}
	rk, err := p.openRank(ctx, env, mem)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rk.Close()) }()
	world, rank, cache, counted := rk.World, rk.Rank(), rk.Cache, rk.Counted
	coord := p.Layout.Coord(rank)
	leader := p.Layout.ReplicaGroup(rank)[0] == rank
	pub := rk.Events // the replica's KV event publisher on its leader (nil elsewhere); rk.Close closes it
	lv := &live{}
	sched := newScheduler(cache, cfg, p.KVShard(coord.TP), p.ReplicaRequests(coord.DP), lv)
	if kv := mem.deviceKV(); kv != nil {
		sched.KV = kv // a host L1 is the cache's own pages, the scheduler's default
	}
	if kv := mem.layeredKV(); kv != nil {
		sched.Layered = kv // the engine's per-layer buffers (--model)
	}
	var eng *modelEngine
	if cfg.Engine == EngineModel {
		if eng, err = p.newModelEngine(mem.kvL1, rk.Groups.Group(parallel.KindAttnCP), cache.CPRank()); err != nil {
			return nil, err
		}
		sched.Engine = eng
	}
	faults := newFaultRunner(cfg, rank, cache)
	if faults != nil {
		sched.Faults = faults
	}
	if pub != nil && faults != nil {
		faults.afterFlush = pub.Flushed
	}
	if leader {
		sched.Misses = newMissTracker(cfg)
	}
	if v := os.Getenv(EnvCorruptRank); v != "" && v == fmt.Sprint(rank) {
		sched.Corrupt = mem.corrupter(p, rk.Set, cache.CPRank())
	}
	reg := rankRegistry(lv, rk.Metrics, metrics.RankLabels(p.Layout, rank))
	stop, err := startReporting(ctx, rank, leader, lv, cache, reg, out)
	if err != nil {
		return nil, err
	}
	before := counted.Counts().Total()
	runErr := sched.Run(ctx)
	stop()
	if runErr != nil {
		return nil, fmt.Errorf("runner: rank %d (replica %d): %w", rank, coord.DP, runErr)
	}
	res := newRankResult(rk, sched, int64(counted.Counts().Total()-before), mem)
	res.Model = eng.result()
	res.WallSeconds = time.Since(start).Seconds()
	var integrity error
	if sched.FirstBad() != nil {
		integrity = fmt.Errorf("rank %d: %w", rank, sched.FirstBad())
	}
	if integrity != nil {
		res.Err = integrity.Error()
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	all, err := world.AllGather(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("runner: gathering the report: %w", err)
	}
	if rank != 0 {
		if integrity != nil {
			return nil, fmt.Errorf("%w: %v", ErrIntegrity, integrity)
		}
		return nil, nil
	}
	results := make([]rankResult, len(all))
	for i, b := range all {
		if err := json.Unmarshal(b, &results[i]); err != nil {
			return nil, fmt.Errorf("runner: report of rank %d: %w", i, err)
		}
	}
	rep = buildReport(p, results)
	rep.Device = buildDeviceReport(results, mem)
	if err := checkReplicas(results); err != nil {
		return rep, err
	}
	rep.WallSeconds = time.Since(start).Seconds()
	if out.StatusDir != "" {
		if err := writeFileAtomic(out.StatusDir, reportFile, rep); err != nil {
			return rep, err
		}
	}
	for _, r := range results {
		if r.Err != "" {
			return rep, fmt.Errorf("%w: %s", ErrIntegrity, r.Err)
		}
	}
	if rep.CollectivesPerStep != 1 {
		return rep, fmt.Errorf("%w: %.3f consensus collectives per scheduler step, want exactly 1", ErrIntegrity, rep.CollectivesPerStep)
	}
	return rep, nil
}

// newRankResult is what rank rk contributes to the report after sched served its requests
// with collectives consensus collectives.
func newRankResult(rk *job.Rank, s *sched.Scheduler, collectives int64, mem *memory) rankResult {
	rank, cache, st := rk.Rank(), rk.Cache, rk.Storage
	coord := rk.Layout.Coord(rank)
	cst := cache.Stats()
	res := rankResult{
		Rank: rank, DP: coord.DP, Leader: rk.Layout.ReplicaGroup(rank)[0] == rank, Backend: rk.Backend, Replica: s.Counts(), Local: s.Local(),
		PagesWritten: cst.PagesWritten, PagesLoaded: cst.PagesLoaded,
		Collectives:  collectives - s.Local().FlushCollectives,
		DigestChecks: cst.DigestChecks, DigestMismatches: cst.DigestMismatches,
		L3Prefetched: cst.L3PrefetchedPages, L3BackedUp: cst.L3BackedUpPages, StorageErrors: cst.StorageErrors,
		CircuitOpenSecs: cst.StorageCircuitOpenSeconds, StorageRead: cst.StoragePagesRead, StorageWritten: cst.StoragePagesWritten,
		Divergences: cst.Divergences, Recoveries: cst.Recoveries, QuarantinedSteps: cst.QuarantinedSteps,
		CopyFailures: cst.AbortedWrites + cst.FailedLoads, Device: mem.result(),
	}
	if st != nil {
		sst := st.Stats()
		res.StorageRejected, res.StorageForged = int64(sst.Corrupt), int64(sst.Forged)
		res.StorageAbandoned = int64(sst.Abandoned)
		res.StorageEvicted, res.StorageExpired = int64(sst.Evicted), int64(sst.Expired)
	}
	if res.Leader {
		res.Timing = s.Timing()
	}
	for _, d := range cst.ConsensusLatency {
		res.LatencyNs = append(res.LatencyNs, int64(d))
	}
	return res
}

// buildReport sums the ranks' results: replica counts once per replica (from its leader),
// page and check counts over every rank.
func buildReport(p *Plan, results []rankResult) *report.Report {
	r := &report.Report{Version: version.Version(), Layout: p.Layout.String(), Workload: p.Desc, ConsensusBackend: results[0].Backend, Storage: redact.URL(p.Config.Storage), KVLayout: p.kvLayoutReport(), L2: p.l2Memory()}
	var lat []time.Duration
	var collectives, steps int64
	for _, x := range results {
		if x.Leader {
			r.Requests += x.Replica.Requests
			r.InputTokens += x.Replica.InputTokens
			r.OutputTokens += x.Replica.OutputTokens
			r.TokensHitL1 += x.Replica.HitL1
			r.TokensHitL2 += x.Replica.HitL2
			r.TokensHitL3 += x.Replica.HitL3
			r.PagesPrefetched += x.L3Prefetched
			r.PrefetchCostSkippedPages += x.Replica.PrefetchCostSkippedPages
			r.PagesBackedUp += x.L3BackedUp
			r.TokensMissed += x.Replica.Missed
			r.SchedulerSteps += x.Replica.Steps
			r.PrefetchSteps += x.Replica.PrefetchSteps
			r.PrefetchRetries += x.Replica.PrefetchRetries
			r.PrefetchRefusedPages += x.Replica.PrefetchRefusedPages
			r.PrefetchRefusedBy.Add(x.Replica.PrefetchRefusedBy)
			r.PrefetchCutPages += x.Replica.PrefetchCutPages
			r.ConsensusSteps += x.Collectives
			r.Divergences += x.Divergences
			r.Recoveries += x.Recoveries
			r.QuarantinedSteps += x.QuarantinedSteps
			r.CopyFailures += x.CopyFailures
			r.Flushes += x.Replica.Flushes
			r.FlushesRefused += x.Replica.FlushesRefused
		}
		collectives += x.Collectives
		steps += x.Replica.Steps
		r.PagesWrittenL2 += x.PagesWritten
		r.PagesLoadedL2 += x.PagesLoaded
		r.DigestChecks += x.DigestChecks
		r.DigestMismatches += x.DigestMismatches
		r.PagesVerified += x.Local.PagesVerified
		if r.KVLayout != nil {
			r.KVLayout.LayerWaits += x.Local.LayerWaits
		}
		r.BadPages += x.Local.BadPages
		r.StorageErrors += x.StorageErrors
		r.StoragePagesRead += x.StorageRead
		r.StoragePagesWritten += x.StorageWritten
		r.StorageRejected += x.StorageRejected
		r.StorageForged += x.StorageForged
		r.StorageCircuitOpenSeconds = max(r.StorageCircuitOpenSeconds, x.CircuitOpenSecs)
		r.StorageAbandoned += x.StorageAbandoned
		r.StorageEvicted += x.StorageEvicted
		r.StorageExpired += x.StorageExpired
		for _, ns := range x.LatencyNs {
			lat = append(lat, time.Duration(ns))
		}
		if x.Backend != r.ConsensusBackend {
			r.ConsensusBackend = "mixed"
		}
	}
	if r.InputTokens > 0 {
		r.HitRate = float64(r.TokensHitL1+r.TokensHitL2+r.TokensHitL3) / float64(r.InputTokens)
	}
	if steps > 0 {
		r.CollectivesPerStep = float64(collectives) / float64(steps)
	}
	r.BytesMoved = (r.PagesWrittenL2 + r.PagesLoadedL2) * int64(p.Config.PageBytes())
	slices.Sort(lat)
	r.ConsensusMedianUs = float64(report.Quantile(lat, 0.5)) / 1e3
	r.ConsensusP99Us = float64(report.Quantile(lat, 0.99)) / 1e3
	addTiming(r, p, results, lat)
	r.Model = buildModelCheck(p, results)
	return r
}

// checkReplicas verifies that every rank of a replica counted what its leader counted:
// they made the same decisions on the same requests.
func checkReplicas(results []rankResult) error {
	leaders := map[int]rankResult{}
	for _, x := range results {
		if x.Leader {
			leaders[x.DP] = x
		}
	}
	for _, x := range results {
		if l := leaders[x.DP]; x.Replica != l.Replica {
			return fmt.Errorf("%w: rank %d of replica %d counted %+v, its leader rank %d counted %+v",
				ErrIntegrity, x.Rank, x.DP, x.Replica, l.Rank, l.Replica)
		}
	}
	return nil
}

// ReadReport reads the report rank 0 left in a status directory.
func ReadReport(dir string) (*report.Report, error) {
	b, err := os.ReadFile(statusPath(dir, reportFile))
	if err != nil {
		return nil, fmt.Errorf("runner: report: %w", err)
	}
	var r report.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("runner: report: %w", err)
	}
	return &r, nil
}

// buildModelCheck sums the reference model's checks (once per replica) and compute (over
// ranks); nil without --engine model.
func buildModelCheck(p *Plan, results []rankResult) *report.ModelCheck {
	if p.Config.Engine != EngineModel {
		return nil
	}
	m := &report.ModelCheck{Variant: p.Config.ModelVariant}
	for _, x := range results {
		if x.Leader {
			m.OutputsChecked += x.Replica.OutputsChecked
			m.OutputsDiffering += x.Replica.OutputsDiffering
		}
		if x.Model != nil {
			m.Tokens += x.Model.Tokens
			m.Seconds += x.Model.Seconds
			m.RefTokens += x.Model.RefTokens
			m.RefSeconds += x.Model.RefSeconds
		}
	}
	return m
}
