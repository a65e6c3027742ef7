package metrics

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// rig is the in-process replicas of one replica group over parallel/local, each with a
// host engine that sleeps a random per-rank delay before every transfer; slab groups share
// kvtest.MemSlabs. It drives the caches through their exported API only.
type rig struct {
	t      testing.TB
	layout *parallel.Layout
	caches []*hicache.Cache
	shards []int // tensor-parallel index of each rank (part of the KV content)
}

type rigConfig struct {
	layout         parallel.LayoutConfig
	opts           hicache.Options
	pagesPerSlab   int
	pageBytes      int
	maxDelay       time.Duration
	seed           uint64
	latencySamples int // Config.LatencySamples (0: the default)
}

func mustLayout(t testing.TB, cfg parallel.LayoutConfig) *parallel.Layout {
	t.Helper()
	l, err := parallel.NewLayout(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newRig(t testing.TB, rc rigConfig) *rig {
	t.Helper()
	l := mustLayout(t, rc.layout)
	replica := l.ReplicaGroup(0)
	n := len(replica)
	r := &rig{t: t, layout: l, caches: make([]*hicache.Cache, n), shards: make([]int, n)}
	members := local.New(replica, local.Options{Kind: "replica", Timeout: 20 * time.Second})
	bySlabGroup := map[int]*kvtest.MemSlabs{}
	slabs := make([]*kvtest.MemSlabs, n)
	for i, rank := range replica {
		sg := l.SlabGroup(rank)
		ms := bySlabGroup[sg[0]]
		if ms == nil {
			ms = kvtest.NewMemSlabs(sg, rc.pagesPerSlab, rc.pageBytes)
			bySlabGroup[sg[0]] = ms
		}
		slabs[i] = ms
		r.shards[i] = l.Coord(rank).TP
	}
	errs := grouptest.Parallel(n, func(i int) error {
		var delay func(hicache.Transfer) time.Duration
		if rc.maxDelay > 0 {
			rng := rand.New(rand.NewPCG(rc.seed, uint64(i)))
			var mu sync.Mutex
			delay = func(hicache.Transfer) time.Duration {
				mu.Lock()
				defer mu.Unlock()
				return time.Duration(rng.Int64N(int64(rc.maxDelay)))
			}
		}
		c, err := hicache.New(context.Background(), hicache.Config{
			Options: rc.opts, Layout: l, Rank: replica[i], Group: members[i], Slabs: slabs[i],
			HostEngine: hicache.HostEngineOptions{Workers: 2, Delay: delay}, LatencySamples: rc.latencySamples,
		})
		r.caches[i] = c
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range r.caches {
			if c != nil {
				c.Close()
			}
		}
	})
	return r
}

// all runs f on every rank concurrently (so that collectives meet) and joins the errors.
func (r *rig) all(f func(i int, c *hicache.Cache) error) error {
	return errors.Join(grouptest.Parallel(len(r.caches), func(i int) error { return f(i, r.caches[i]) })...)
}

// step runs one consensus step everywhere.
func (r *rig) step() error {
	return r.all(func(_ int, c *hicache.Cache) error { return c.Step(context.Background()) })
}

// workload runs steps scheduler steps on every rank: the same random inserts (each rank
// filling the pages it owns), matches and evictions everywhere (one seed), one consensus
// step after each; then it steps until no transfer is in flight.
func (r *rig) workload(steps int, seed uint64) {
	r.t.Helper()
	err := r.all(func(i int, c *hicache.Cache) error {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 99))
		seqs := kvtest.RandomSequences(rng, 40, c.Geometry().PageSize)
		for range steps {
			for k := rng.IntN(3); k >= 0; k-- {
				tokens := seqs[rng.IntN(rng.IntN(len(seqs))+1)] // skewed: low indices are hot
				switch op := rng.IntN(12); {
				case op < 4:
					res, err := c.Insert(hicache.Request{Tokens: tokens})
					if err != nil && !errors.Is(err, hicache.ErrL1Full) {
						return err
					}
					for _, f := range res.Fill {
						if c.Owns(f.Index) {
							b, err := c.L1Page(f.Slot)
							if err != nil {
								return err
							}
							kvtest.FillKV(b, f.Hash.Index(), f.Index, r.shards[i])
						}
					}
				case op < 9:
					if _, err := c.Match(hicache.Request{Tokens: tokens}); err != nil {
						return err
					}
				default:
					if _, _, err := c.EvictL1(rng.IntN(12)); err != nil {
						return err
					}
					if _, err := c.EvictL2(rng.IntN(12) * rng.IntN(2)); err != nil {
						return err
					}
				}
			}
			if err := c.Step(ctx); err != nil {
				return err
			}
		}
		for k := 0; c.Pending() > 0; k++ {
			if k > 10000 {
				return errors.New("cache never became idle")
			}
			if err := c.Step(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// metricValue returns the value of family name's sample whose labels include want (a
// counter, gauge, or a histogram's sample count), failing the test when there is none.
func metricValue(t *testing.T, fams []*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	t.Fatalf("no sample %s%v", name, want)
	return 0
}

// TestCollector: four ranks (two slab groups of two CP ranks) run a workload; every
// exported figure equals the rank's Stats, labels name rank, replica and slab group, the
// histogram holds the latencies Stats kept, and the metrics pass the Prometheus linter.
func TestCollector(t *testing.T) {
	ns, err := storage.NewNamespace("metrics")
	if err != nil {
		t.Fatal(err)
	}
	st, err := stores.Open(t.Context(), "mem://metrics-test", storage.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := newRig(t, rigConfig{
		layout:       parallel.LayoutConfig{World: 4, AttnCP: 2},
		opts:         hicache.Options{PageSize: 4, L1Pages: 64, MinLoadPages: 2, LoadQuotaPages: 64},
		pagesPerSlab: 24, pageBytes: 64, maxDelay: 300 * time.Microsecond, seed: 3,
	})
	reg := prometheus.NewPedanticRegistry()
	for i, c := range r.caches {
		var cst storage.Storage
		if i == 0 {
			cst = st // counters of a storage, on one rank
		}
		reg.MustRegister(NewCollector(c, RankLabels(r.layout, r.layout.ReplicaGroup(0)[i]), cst))
	}
	r.workload(300, 11)
	if err := st.Put(t.Context(), []storage.Key{storage.NewKey(ns, 1)}, [][]byte{make([]byte, 100)}); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	wantSlabGroup := map[int]string{0: "0", 1: "1", 2: "0", 3: "1"} // slab groups {0,2} and {1,3}
	for i, c := range r.caches {
		s := c.Stats()
		rank := r.layout.ReplicaGroup(0)[i]
		lbl := func(kv ...string) map[string]string {
			m := map[string]string{"rank": strconv.Itoa(rank), "replica": "0", "slab_group": wantSlabGroup[rank]}
			for j := 0; j < len(kv); j += 2 {
				m[kv[j]] = kv[j+1]
			}
			return m
		}
		for _, want := range []struct {
			name   string
			labels map[string]string
			value  int64
		}{
			{"cpcache_hit_tokens_total", lbl("tier", "l1"), 4 * s.L1HitPages},
			{"cpcache_hit_tokens_total", lbl("tier", "l2"), 4 * s.L2HitPages},
			{"cpcache_prompt_tokens_total", lbl(), s.PromptTokens},
			{"cpcache_missed_tokens_total", lbl(), s.MissedTokens},
			{"cpcache_pages_written_total", lbl("tier", "l2"), s.PagesWritten},
			{"cpcache_pages_loaded_total", lbl("tier", "l2"), s.PagesLoaded},
			{"cpcache_pages_evicted_total", lbl("tier", "l1"), s.EvictedL1Pages},
			{"cpcache_pages_evicted_total", lbl("tier", "l2"), s.EvictedL2Pages},
			{"cpcache_l1_used_pages", lbl(), int64(s.L1Used)},
			{"cpcache_l2_used_pages", lbl(), int64(2*24 - s.L2FreePages)},
			{"cpcache_l2_capacity_pages", lbl(), 2 * 24},
			{"cpcache_steps_total", lbl(), s.Steps},
			{"cpcache_collectives_total", lbl(), s.Collectives},
			{"cpcache_no_step_warnings_total", lbl(), s.NoStepWarnings},
			{"cpcache_divergences_total", lbl(), s.Divergences},
			{"cpcache_recoveries_total", lbl(), s.Recoveries},
			// The first scrape observes the latencies Stats kept (the newest LatencySamples).
			{"cpcache_consensus_latency_seconds", lbl(), min(s.ConsensusTimed, int64(len(s.ConsensusLatency)))},
		} {
			if got := metricValue(t, fams, want.name, want.labels); got != float64(want.value) {
				t.Errorf("rank %d: %s%v = %v, Stats say %d", rank, want.name, want.labels, got, want.value)
			}
		}
		if hits := 4 * (s.L1HitPages + s.L2HitPages); s.MissedTokens != s.PromptTokens-hits || s.MissedTokens == 0 {
			t.Errorf("rank %d: %d prompt tokens, %d hit, %d missed", rank, s.PromptTokens, hits, s.MissedTokens)
		}
		if s.L1HitPages == 0 || s.PagesWritten == 0 || s.EvictedL1Pages == 0 || s.ConsensusTimed < 300 {
			t.Fatalf("rank %d: the workload exercised too little: %+v", rank, s.CoreStats)
		}
	}
	if got := metricValue(t, fams, "cpcache_storage_bytes_total", map[string]string{"rank": "0", "direction": "written"}); got != 100 {
		t.Errorf("storage bytes written: %v, want 100", got)
	}
	problems, err := testutil.CollectAndLint(NewCollector(r.caches[0], RankLabels(r.layout, 0), st))
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
}

// TestCollectorLatencyWindow: a scrape observes only the steps timed since the previous
// one, at most the LatencySamples that Stats keeps, each once.
func TestCollectorLatencyWindow(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 2, AttnCP: 2}, opts: hicache.Options{PageSize: 4, L1Pages: 8}, pagesPerSlab: 8, pageBytes: 64,
		latencySamples: 4})
	col := NewCollector(r.caches[0], RankLabels(r.layout, 0), nil)
	count := func() (uint64, float64) {
		var m dto.Metric
		if err := col.latency.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
	}
	steps := func(n int) {
		for range n {
			if err := r.step(); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps(3)
	testutil.CollectAndCount(col)
	if n, sum := count(); n != 3 || sum <= 0 {
		t.Fatalf("after 3 steps: %d samples, sum %v", n, sum)
	}
	testutil.CollectAndCount(col)
	n3, sum3 := count()
	if n3 != 3 {
		t.Fatalf("a second scrape without steps: %d samples, want 3 (none twice)", n3)
	}
	steps(10)
	testutil.CollectAndCount(col)
	s := r.caches[0].Stats()
	var want float64
	for _, d := range s.ConsensusLatency {
		want += d.Seconds()
	}
	n, sum := count()
	if n != 3+4 || s.ConsensusTimed != 13 {
		t.Fatalf("10 more steps with a window of 4: %d samples (timed %d), want 7", n, s.ConsensusTimed)
	}
	if diff := sum - sum3 - want; diff > 1e-9 || diff < -1e-9 {
		t.Fatalf("the scrape added %vs, the 4 newest latencies are %vs", sum-sum3, want)
	}
}

// TestCollectorConcurrentScrapes: scrapes that overlap while the cache steps (several
// registries, or concurrent Gathers) neither panic nor observe a latency twice: a scrape
// whose snapshot is older than one a concurrent scrape already observed must neither slice
// the latency ring out of range nor set the observed count back (so that the next scrape
// would observe the same steps again).
func TestCollectorConcurrentScrapes(t *testing.T) {
	l := mustLayout(t, parallel.LayoutConfig{World: 1})
	members := local.New(l.ReplicaGroup(0), local.Options{Kind: "replica", Timeout: 5 * time.Second})
	c, err := hicache.New(context.Background(), hicache.Config{Options: hicache.Options{PageSize: 4, L1Pages: 16}, Layout: l, Rank: 0,
		Group: members[0], Slabs: kvtest.NewMemSlabs(l.SlabGroup(0), 8, 64), LatencySamples: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	col := NewCollector(c, Labels{}, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				col.Collect(make(chan prometheus.Metric, 100))
			}
		}()
	}
	for range 2000 {
		if err := c.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	col.Collect(make(chan prometheus.Metric, 100))
	var m dto.Metric
	if err := col.latency.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got, timed := m.GetHistogram().GetSampleCount(), c.Stats().ConsensusTimed; got > uint64(timed) {
		t.Fatalf("the histogram observed %d latencies of %d timed steps", got, timed)
	}
}

// statsStore is a storage whose Stats return a fixed snapshot.
type statsStore struct {
	storage.Storage
	st storage.Stats
}

func (s statsStore) Stats() storage.Stats { return s.st }

// TestCollectorRejectedValuesNeverWrap: storage.Stats loads its counters one by one, so a
// snapshot taken while a forged value is counted can hold one more Forged than Corrupt; the
// damaged count (Corrupt - Forged) must not wrap around to 2^64 then.
func TestCollectorRejectedValuesNeverWrap(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 1}, opts: hicache.Options{PageSize: 4, L1Pages: 8}, pagesPerSlab: 8, pageBytes: 64})
	col := NewCollector(r.caches[0], RankLabels(r.layout, 0), statsStore{st: storage.Stats{Corrupt: 3, Forged: 4}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	damaged := metricValue(t, fams, "cpcache_storage_rejected_values_total", map[string]string{"cause": "damaged"})
	forged := metricValue(t, fams, "cpcache_storage_rejected_values_total", map[string]string{"cause": "forged"})
	if damaged != 0 || forged > 3 {
		t.Fatalf("rejected values: damaged %v, forged %v from Corrupt 3 (Forged 4 counted ahead)", damaged, forged)
	}
}

// TestCollectorStorageAbandoned: the storage operations abandoned at their deadline and
// those of them still stuck in the kernel are exported (a counter and a gauge).
func TestCollectorStorageAbandoned(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 1}, opts: hicache.Options{PageSize: 4, L1Pages: 8}, pagesPerSlab: 8, pageBytes: 64})
	col := NewCollector(r.caches[0], RankLabels(r.layout, 0), statsStore{st: storage.Stats{Abandoned: 7, Stuck: 2}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, fams, "cpcache_storage_abandoned_operations_total", nil); got != 7 {
		t.Errorf("cpcache_storage_abandoned_operations_total = %v, want 7", got)
	}
	if got := metricValue(t, fams, "cpcache_storage_stuck_operations", nil); got != 2 {
		t.Errorf("cpcache_storage_stuck_operations = %v, want 2", got)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
}

// TestCollectorStorageEvicted: the values a file store evicted for its capacity and for its
// TTL are exported, by cause.
func TestCollectorStorageEvicted(t *testing.T) {
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 1}, opts: hicache.Options{PageSize: 4, L1Pages: 8}, pagesPerSlab: 8, pageBytes: 64})
	col := NewCollector(r.caches[0], RankLabels(r.layout, 0), statsStore{st: storage.Stats{Evicted: 11, Expired: 5}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for cause, want := range map[string]float64{"capacity": 11, "ttl": 5} {
		if got := metricValue(t, fams, "cpcache_storage_evicted_values_total", map[string]string{"cause": cause}); got != want {
			t.Errorf("cpcache_storage_evicted_values_total{cause=%q} = %v, want %v", cause, got, want)
		}
	}
	if got := metricValue(t, fams, "cpcache_storage_stuck_operations", nil); got != 0 {
		t.Errorf("cpcache_storage_stuck_operations = %v, want 2", got)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
}
