package runner

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/workload"
)

// rankOutcome is what one in-process rank's scheduler ended with.
type rankOutcome struct {
	counts      sched.Counts
	local       sched.Local
	collectives int
	loaded      int64
	stats       hicache.Stats
	firstBad    error
	err         error
	timing      *report.ReplicaTiming // leaders: virtual time and miss causes
	// prefetchesLeft and prefetchHeld are the scheduler's prefetch entries and their weight
	// when its loop ended (both 0 once every request was served).
	prefetchesLeft, prefetchHeld int
	model                        *modelResult // --engine model: what the rank's reference model computed
}

// inProcessTimeout bounds a runInProcess run.
var inProcessTimeout = 2 * time.Minute

// runInProcess runs the plan's replicas with every rank as a goroutine: local groups for
// consensus, in-process slabs for L2. corruptRank (-1: none) damages one L2 page it owns
// before its first load.
func runInProcess(t *testing.T, p *Plan, corruptRank int) []rankOutcome {
	t.Helper()
	return runInProcessWith(t, p, inProcessOptions{corruptRank: corruptRank})
}

// inProcessOptions are runInProcessWith's hooks into each rank.
type inProcessOptions struct {
	corruptRank int // -1: none (see runInProcess)
	// corruptNode: with per-layer pages the corrupt rank damages every page it owns of the first
	// node it loads, not one (one page may be left to compute when L1 has no room for it).
	corruptNode bool
	// wrapStorage, if set, wraps each rank's storage handle (faults of the store).
	wrapStorage func(rank int, st storage.Storage) storage.Storage
	// afterSchedule, if set, gives each rank's scheduler its afterSchedule hook.
	afterSchedule func(rank int, s *sched.Scheduler) func(context.Context) error
	// onPrefilled, if set, is told each request a rank prefilled and its hit tokens.
	onPrefilled func(rank int, r workload.Request, hitTokens int64)
	// damageL1, if set with --engine model, is each rank's reference model's damage hook
	// (modelEngine.damage; nil for a rank: none).
	damageL1 func(rank int) func(l1 *kvmem.L1, slots []int32)
}

// runInProcessWith is runInProcess with the hooks of o.
func runInProcessWith(t *testing.T, p *Plan, opts inProcessOptions) []rankOutcome {
	t.Helper()
	corruptRank := opts.corruptRank
	l := p.Layout
	W := l.Config.World
	groups := make([]inProcessGroups, W)
	for _, ranks := range l.Groups(parallel.KindReplica) {
		for i, m := range local.New(ranks, local.Options{Kind: "replica"}) {
			groups[ranks[i]] = inProcessGroups{replica: m}
		}
	}
	for _, ranks := range l.Groups(parallel.KindAttnCP) {
		for i, m := range local.New(ranks, local.Options{Kind: "attn_cp"}) {
			groups[ranks[i]].attnCP = m
		}
	}
	worlds := local.World(W, local.Options{Kind: "world"})
	slabs := make([]*kvtest.MemSlabs, W)
	for _, ranks := range l.Groups(parallel.KindSlab) {
		ms := kvtest.NewMemSlabs(ranks, p.Config.L2Pages, p.Config.PageBytes())
		for _, r := range ranks {
			slabs[r] = ms
		}
	}
	if p.SharesL2() {
		// The TP ranks of a DP block share the slabs of its TP-0 ranks.
		for _, ranks := range l.Groups(parallel.KindReplica) {
			ms := kvtest.NewMemSlabs(l.SharedSlabGroup(ranks[0]), p.Config.L2Pages, p.Config.PageBytes())
			for _, r := range ranks {
				slabs[r] = ms
			}
		}
	}
	out := make([]rankOutcome, W)
	var wg sync.WaitGroup
	for rank := range W {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer worlds[rank].Close()
			o := &out[rank]
			ctx, cancel := context.WithTimeout(context.Background(), inProcessTimeout)
			defer cancel()
			// The run's rank (jobConfig) over in-process groups and slabs: no consensus step
			// timeout but the context's, no latency samples, no storage faults but the hook's.
			jc := p.jobConfig(rank)
			jc.World, jc.Groups, jc.Slabs = worlds[rank], groups[rank], slabs[rank]
			jc.StepTimeout, jc.LatencySamples, jc.WrapStorage, jc.ClearStorage = 0, 0, nil, nil
			if opts.wrapStorage != nil {
				jc.WrapStorage = func(st storage.Storage) storage.Storage { return opts.wrapStorage(rank, st) }
			}
			kvL1, err := p.kvMemory(&jc) // as openRank: a host run with --model lends per-layer buffers
			if err != nil {
				o.err = err
				return
			}
			rk, err := job.Open(ctx, jc)
			if err != nil {
				o.err = err
				return
			}
			defer rk.Close()
			cache, counted := rk.Cache, rk.Counted
			coord := l.Coord(rank)
			s := newScheduler(cache, &p.Config, p.KVShard(coord.TP), p.ReplicaRequests(coord.DP), &live{})
			if kvL1 != nil {
				s.Layered = layeredKV{kvL1}
			}
			if p.Config.Engine == EngineModel {
				eng, err := p.newModelEngine(kvL1, rk.Groups.Group(parallel.KindAttnCP), cache.CPRank())
				if err != nil {
					o.err = err
					return
				}
				if opts.damageL1 != nil {
					eng.damage = opts.damageL1(rank)
				}
				s.Engine = eng
				defer func() { o.model = eng.result() }()
			}
			leader := l.ReplicaGroup(rank)[0] == rank
			if leader {
				s.Misses = newMissTracker(&p.Config)
			}
			if opts.afterSchedule != nil {
				s.AfterSchedule = opts.afterSchedule(rank, s)
			}
			s.Faults = newFaultRunner(&p.Config, rank, cache) // flush faults (no kill or stall in-process)
			if opts.onPrefilled != nil {
				s.Observe(sched.OnPrefilled(func(r workload.Request, hit int64) { opts.onPrefilled(rank, r, hit) }))
			}
			if rank == corruptRank {
				done := false
				s.Corrupt = func(n hicache.NodeInfo) {
					if done {
						return
					}
					for _, pg := range n.L2 {
						if pg.Slab != cache.CPRank() || (done && !opts.corruptNode) {
							continue
						}
						if kvL1 != nil { // per-layer pages: layer 0 of the page's own bytes in either L2 layout
							require.NoError(t, p.damageL2Page(slabs[rank], pg))
						} else {
							b, _ := slabs[rank].Page(pg)
							b[3] ^= 1
						}
						done = true
					}
				}
			}
			before := counted.Counts().Total()
			o.err = s.Run(ctx)
			o.counts, o.local, o.firstBad = s.Counts(), s.Local(), s.FirstBad()
			o.prefetchesLeft, o.prefetchHeld = s.Prefetches()
			o.collectives = counted.Counts().Total() - before - int(s.Local().FlushCollectives) // as rank.go counts them
			o.stats = cache.Stats()
			o.loaded = o.stats.PagesLoaded
			if leader {
				o.timing = s.Timing()
			}
		}()
	}
	wg.Wait()
	return out
}

// inProcessGroups are an in-process rank's groups: its replica group (the consensus group;
// the slabs are in-process too).
type inProcessGroups struct{ replica, attnCP parallel.Group }

func (g inProcessGroups) Group(kind parallel.GroupKind) parallel.Group {
	switch kind {
	case parallel.KindReplica:
		return g.replica
	case parallel.KindAttnCP:
		return g.attnCP
	}
	return nil
}

func smallPlan(t *testing.T, lc parallel.LayoutConfig, mutate func(*Config)) *Plan {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Layout = lc
	cfg.Synthetic = workload.SyntheticConfig{Clients: 6, Rounds: 4, SystemTokens: 64, QuestionTokens: 96, AnswerTokens: 8, Seed: 3}
	// L1Pages is per rank and each rank holds only the pages it owns: 96/CP per rank is an
	// L1 of 96 pages of the tree.
	cfg.PageSize, cfg.L1Pages, cfg.L2Pages, cfg.KVBytesPerToken = 8, 96/max(lc.AttnCP, 1), 256, 8
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := Prepare(cfg)
	require.NoError(t, err)
	return p
}

// requireAgreed checks what every run must show: no error, no bad page, every rank of a
// replica counted what its leader counted, one consensus collective per scheduler step,
// every loaded page verified, every prompt token a hit or a miss, every request served once.
func requireAgreed(t *testing.T, p *Plan, out []rankOutcome) {
	t.Helper()
	var served int64
	for rank, o := range out {
		require.NoError(t, o.err, "rank %d", rank)
		require.NoError(t, o.firstBad, "rank %d", rank)
		leader := p.Layout.ReplicaGroup(rank)[0]
		assert.Equal(t, out[leader].counts, o.counts, "rank %d counts differ from its replica leader %d", rank, leader)
		assert.Equal(t, int(o.counts.Steps), o.collectives, "rank %d: one consensus collective per step", rank)
		assert.Equal(t, o.loaded, o.local.PagesVerified, "rank %d verifies every page it loaded", rank)
		assert.Zero(t, o.local.BadPages)
		if leader == rank {
			served += o.counts.Requests
			assert.Equal(t, o.counts.InputTokens, o.counts.HitL1+o.counts.HitL2+o.counts.HitL3+o.counts.Missed)
		}
	}
	assert.Equal(t, int64(len(p.Requests)), served, "every request served once")
}

func TestReplicasAgreeAndServeFromL2(t *testing.T) {
	layouts := map[string]parallel.LayoutConfig{
		"cp2dp2": {World: 4, DP: 2, AttnCP: 2, DPAttention: true},
		"cp2tp2": {World: 4, AttnCP: 2},
	}
	for name, lc := range layouts {
		for _, policy := range []hicache.Policy{hicache.WriteThrough, hicache.WriteBack} {
			t.Run(name+"/"+policy.String(), func(t *testing.T) {
				// No shared system prompt: each conversation's history is a chain of its own
				// that only grows (no insert needs to split a node with I/O in flight), so every
				// turn's history is cached. A replica serves 3 conversations whose histories
				// before the last turn (3 × 39 pages) overflow its 96 L1 pages, and all fit in
				// L2 (2 × 256 pages): pages evicted from L1 before the last turns are prefixes
				// of those turns and must come back from L2.
				p := smallPlan(t, lc, func(c *Config) { c.Policy, c.Synthetic.SystemTokens = policy, 0 })
				out := runInProcess(t, p, -1)
				requireAgreed(t, p, out)
				for rank, o := range out {
					if p.Layout.ReplicaGroup(rank)[0] == rank {
						assert.Positive(t, o.stats.EvictedL1Pages, "replica of rank %d: its histories overflow L1", rank)
						assert.Positive(t, o.counts.HitL2, "replica of rank %d: histories evicted from L1 come back from L2", rank)
						assert.Zero(t, o.stats.EvictedL2Pages, "replica of rank %d: L2 holds every history", rank)
					}
				}
			})
		}
	}
}

func TestSecondRunHitsStorage(t *testing.T) {
	// Two runs of the same plan share a storage (in-process, mem://): the first backs up
	// every page it writes to L2 and, with L2 holding everything, never needs storage; the
	// second starts with empty L1 and L2 and prefetches the histories from storage. Every
	// page prefetched and loaded back is verified.
	// With PrefetchSync the scheduler waits for each prefetch in steps where nothing
	// decodes; otherwise the request waits in the queue and the others run on.
	for _, name := range []string{"best-effort", "wait-complete", "timeout", "best-effort/sync", "wait-complete/sync"} {
		policy, mode, _ := strings.Cut(name, "/")
		t.Run(name, func(t *testing.T) {
			pp, err := ParsePrefetchPolicy(policy)
			require.NoError(t, err)
			url := "mem://runner-test-" + t.Name()
			p := smallPlan(t, parallel.LayoutConfig{World: 4, AttnCP: 2}, func(c *Config) {
				c.Storage, c.PrefetchPolicy, c.Time.PrefetchSync = url, pp, mode == "sync"
			})
			st, _, err := p.openStorage(context.Background())
			require.NoError(t, err)
			require.NoError(t, st.Clear(context.Background()))
			require.NoError(t, st.Close())

			first := runInProcess(t, p, -1)
			requireAgreed(t, p, first)
			second := runInProcess(t, p, -1)
			requireAgreed(t, p, second)
			assert.Zero(t, first[0].counts.HitL3, "the first run finds nothing in storage it needs")
			assert.Positive(t, first[0].stats.L3BackedUpPages, "the first run backs its pages up")
			assert.Positive(t, second[0].counts.HitL3, "the second run hits storage")
			assert.Positive(t, second[0].stats.L3PrefetchedPages)
			assert.Less(t, second[0].counts.Missed, first[0].counts.Missed, "storage hits replace misses")
			if mode == "sync" {
				assert.Positive(t, second[0].counts.PrefetchSteps, "the synchronous scheduler waits in steps")
			} else {
				assert.Zero(t, second[0].counts.PrefetchSteps, "no step waits for a prefetch")
			}
			for rank, o := range append(first, second...) {
				assert.Zero(t, o.stats.StorageErrors, "rank %d", rank%4)
			}
		})
	}
}

func TestCorruptL2PageIsNamed(t *testing.T) {
	p := smallPlan(t, parallel.LayoutConfig{World: 2, AttnCP: 2}, nil)
	out := runInProcess(t, p, 1)
	require.NoError(t, out[1].err, "a bad page does not stop the run")
	require.Error(t, out[1].firstBad)
	assert.Regexp(t, `request \d+: page \d+ loaded from L2 is wrong: kvtest: page \d+`, out[1].firstBad.Error())
	assert.Positive(t, out[1].local.BadPages)
	assert.NoError(t, out[0].firstBad, "rank 0 loads only its own pages")
}

func TestRouteKeepsConversationsAndPrefixesTogether(t *testing.T) {
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: 4, DP: 4, DPAttention: true})
	require.NoError(t, err)
	for c := range 9 {
		assert.Equal(t, c%4, Route(l, workload.Request{Client: c, Tokens: []int32{1}}, workload.BlockTokens))
	}
	a := workload.Request{Client: -1, Tokens: make([]int32, 700)}
	b := workload.Request{Client: -1, Tokens: make([]int32, 600)}
	for i := range a.Tokens {
		a.Tokens[i] = workload.BlockToken(7, i%workload.BlockTokens)
	}
	copy(b.Tokens, a.Tokens[:workload.BlockTokens])
	assert.Equal(t, Route(l, a, workload.BlockTokens), Route(l, b, workload.BlockTokens), "same first block, same replica")
	seen := map[int]bool{}
	for id := range uint64(64) {
		r := workload.Request{Client: -1, Tokens: []int32{workload.BlockToken(id, 0), workload.BlockToken(id, 1)}}
		seen[Route(l, r, workload.BlockTokens)] = true
	}
	assert.Len(t, seen, 4, "trace requests spread over every replica")
	// At --trace-scale 8 a first block is 64 tokens: requests sharing it meet whatever follows.
	seen = map[int]bool{}
	for id := range uint64(16) {
		r := workload.Request{Client: -1, Tokens: slices.Clone(a.Tokens[:64])}
		for j := range 64 {
			r.Tokens = append(r.Tokens, workload.BlockToken(100+id, j))
		}
		seen[Route(l, r, 64)] = true
	}
	assert.Len(t, seen, 1, "scaled trace requests with the same first block, one replica")

	// Through a Plan: a trace whose 16 requests share only their first hash id, read at
	// --trace-scale 8 on 4 replicas, has every request in one replica's ReplicaRequests
	// (routed by the plan's 64-token blocks); routed by 512 tokens, their whole prompts,
	// they would spread.
	var lines []string
	for k := range 16 {
		lines = append(lines, fmt.Sprintf(`{"timestamp": %d, "input_length": 1024, "output_length": 16, "hash_ids": [0, %d]}`, k, 100+k))
	}
	cfg := DefaultConfig()
	cfg.Layout = parallel.LayoutConfig{World: 16, DP: 4, AttnCP: 4, DPAttention: true}
	cfg.Workload, cfg.TracePath, cfg.TraceScale = WorkloadTrace, inlineTrace(t, lines...), 8
	p, err := Prepare(cfg)
	require.NoError(t, err)
	require.Equal(t, 4, p.Layout.AttnDP)
	require.Len(t, p.Requests, 16)
	served := map[int]int{}
	for dp := range p.Layout.AttnDP {
		if n := len(p.ReplicaRequests(dp)); n > 0 {
			served[dp] = n
		}
	}
	assert.Len(t, served, 1, "one replica serves every request sharing the first 64-token block: %v", served)
	assert.Equal(t, len(p.Requests), slices.Collect(maps.Values(served))[0])
	seen = map[int]bool{}
	for _, r := range p.Requests {
		require.Len(t, r.Tokens, 128)
		seen[Route(p.Layout, r, workload.BlockTokens)] = true
	}
	assert.Greater(t, len(seen), 1, "routed by 512-token blocks the same requests spread")
}

func TestPrepareRejectsBadInput(t *testing.T) {
	cases := map[string]func(*Config){
		"layout: parallel: bad layout":           func(c *Config) { c.Layout.World = 12 },
		"L1 pages 4 cannot hold request":         func(c *Config) { c.L1Pages = 4 },
		"L2 pages 1 per slab":                    func(c *Config) { c.L2Pages = 1 },
		"batch tokens 0":                         func(c *Config) { c.BatchTokens = 0 },
		"requests -1 is negative":                func(c *Config) { c.Requests = -1 },
		"needs --workload trace":                 func(c *Config) { c.TracePath = "x.jsonl" },
		"--trace-scale 8 needs --workload trace": func(c *Config) { c.TraceScale = 8 },
		"workload: clients 0":                    func(c *Config) { c.Synthetic.Clients = 0 },
		`unknown scheme "ftp"`:                   func(c *Config) { c.Storage = "ftp://host/x" },
		"--storage-clear needs --storage":        func(c *Config) { c.StorageClear = true },
		"timeout -1s is negative":                func(c *Config) { c.Timeout = -time.Second },
		// A storage's settings without a storage are refused, not ignored.
		"--storage-key-file k.key needs --storage":        func(c *Config) { c.StorageKeyFile = "k.key" },
		"--storage-insecure needs --storage":              func(c *Config) { c.StorageInsecure = true },
		"--storage-timeout 1s needs --storage":            func(c *Config) { c.StorageTimeout = time.Second },
		"--prefetch-policy wait-complete needs --storage": func(c *Config) { c.PrefetchPolicy = hicache.PrefetchWaitComplete },
	}
	for want, mutate := range cases {
		cfg := DefaultConfig()
		mutate(&cfg)
		_, err := Prepare(cfg)
		require.ErrorIs(t, err, ErrBadInput, want)
		assert.Contains(t, err.Error(), want)
	}
	cfg := DefaultConfig()
	cfg.Requests = 10
	p, err := Prepare(cfg)
	require.NoError(t, err)
	assert.Len(t, p.Requests, 10)
	assert.Equal(t, 16, p.Layout.Config.EP, "ep 0 is the world")
	var all []workload.Request
	for dp := range p.Layout.AttnDP {
		all = append(all, p.ReplicaRequests(dp)...)
	}
	slices.SortFunc(all, func(a, b workload.Request) int { return a.ID - b.ID })
	assert.Equal(t, p.Requests, all, "the replicas partition the workload")
}

// TestPrepareRejectsArrivalsPastTheVirtualClock: a trace timestamp past what virtual
// nanoseconds can count (int64) is refused: it must not wrap around into negative TTFTs in
// the report.
func TestPrepareRejectsArrivalsPastTheVirtualClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(`{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}`+"\n"+
		`{"timestamp": 9000000000000000, "input_length": 600, "output_length": 4, "hash_ids": [1, 3]}`+"\n"), 0o600))
	cfg := DefaultConfig()
	cfg.Workload, cfg.TracePath = WorkloadTrace, path
	_, err := Prepare(cfg)
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "request 1 arrives at 9000000000000000 ms")
	cfg.Time.Mode = TimeNone // served back to back: arrival times do not matter
	_, err = Prepare(cfg)
	require.NoError(t, err)
}

// TestTurnsWaitForTheirPreviousTurnWhileItPrefetches: with prefetches overlapping decode, a
// turn waiting in the queue for its prefetch did not hold back its conversation's next
// turns: those asked storage for their prompt before the turn before them had its answer
// (and never asked again once it had), and one whose prefetch was over first was admitted
// before the turn before it. (Holding them back needs two more things: a prefetch read while
// the queue is stopped releases its lock, which may be the L1 room the request before it
// waits for, and an idle clock jumps to the waiting turn's read, not to a later turn's
// arrival; without them the run spun without progress.) Each client's prompts are cut by as many tokens as its number,
// so that a prompt's length names its client and turn in the admission order the virtual
// clock records.
func TestTurnsWaitForTheirPreviousTurnWhileItPrefetches(t *testing.T) {
	url := "mem://runner-test-" + t.Name()
	p := smallPlan(t, parallel.LayoutConfig{World: 2, AttnCP: 2}, func(c *Config) {
		c.Storage = url
		c.Synthetic = workload.SyntheticConfig{Clients: 6, Rounds: 4, SystemTokens: 256, QuestionTokens: 384, AnswerTokens: 64, Seed: 1}
		c.PageSize, c.L1Pages, c.L2Pages = 16, 100, 150 // L1: 200 pages over the 2 ranks
	})
	turn := map[int32][2]int{} // prompt length: client, round
	for i, r := range p.Requests {
		p.Requests[i].Tokens = r.Tokens[:len(r.Tokens)-r.Client]
		turn[int32(len(p.Requests[i].Tokens))] = [2]int{r.Client, r.Round}
	}
	require.Len(t, turn, len(p.Requests))
	st, _, err := p.openStorage(context.Background())
	require.NoError(t, err)
	require.NoError(t, st.Clear(context.Background()))
	require.NoError(t, st.Close())
	for run := range 5 { // the later runs find the first one's pages in storage
		out := runInProcess(t, p, -1)
		requireAgreed(t, p, out)
		next := map[int]int{} // client: its next round
		for _, tm := range out[0].timing.Requests {
			ct := turn[tm.Prompt]
			assert.Equal(t, next[ct[0]], ct[1], "run %d: client %d's turns in order", run, ct[0])
			next[ct[0]] = ct[1] + 1
		}
		if run > 0 {
			assert.Positive(t, out[0].counts.HitL3, "run %d hits storage", run)
		}
	}
}
