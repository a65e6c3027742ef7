package metrics

import (
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// Labels name the rank a Collector reports: its global rank, its replica (the
// attention-DP index) and its slab group (the index of its attention-CP group in the
// layout). They become the constant labels rank, replica and slab_group.
type Labels struct {
	Rank, Replica, SlabGroup int
}

// Labels returns the labels as Prometheus constant labels.
func (l Labels) Labels() prometheus.Labels {
	return prometheus.Labels{
		"rank":       strconv.Itoa(l.Rank),
		"replica":    strconv.Itoa(l.Replica),
		"slab_group": strconv.Itoa(l.SlabGroup),
	}
}

// RankLabels returns the labels of rank in layout.
func RankLabels(layout *parallel.Layout, rank int) Labels {
	sg := layout.SlabGroup(rank)
	return Labels{
		Rank:      rank,
		Replica:   layout.Coord(rank).DP,
		SlabGroup: slices.IndexFunc(layout.Groups(parallel.KindSlab), func(g []int) bool { return g[0] == sg[0] }),
	}
}

// ConsensusLatencyBuckets are the bucket bounds (seconds) of cpcache_consensus_latency_seconds:
// 10µs to about 2.6s, ×4 apart (one shared-memory step is microseconds; Gloo over TCP is
// about a millisecond; a straggler shows up in the top buckets).
var ConsensusLatencyBuckets = prometheus.ExponentialBuckets(10e-6, 4, 10)

// Collector is a prometheus.Collector of one rank's Cache, built on Cache.Stats and
// Cache.Geometry: register it with any registry (reg.MustRegister(metrics.NewCollector(cache, labels, st))). Every scrape
// takes one Stats snapshot. Counters are cumulative since New (Flush does not reset them);
// CoreStats counters are the group's agreed figures, so every rank of a replica reports the
// same values for them, while the copy, transfer and storage counters are this rank's own.
//
// The latency histogram is fed from Stats.ConsensusLatency: a scrape observes the steps
// timed since the previous one, of which Stats keeps the newest Config.LatencySamples
// (default 1024). If more steps than that pass between two scrapes, the older ones are not
// observed: cpcache_consensus_latency_seconds_count then falls behind cpcache_steps_total.
//
// Safe for concurrent scrapes.
type Collector struct {
	cache    *hicache.Cache
	st       storage.Storage // nil: no storage counters
	pageSize float64         // tokens per page
	l1Pages  float64
	l2Pages  float64
	descs    []*prometheus.Desc // of metricDefs, nil where the def needs the absent storage

	mu      sync.Mutex // protects timed and latency (a scrape observes new samples), held across the Stats snapshot
	timed   int64      // Stats.ConsensusTimed already observed
	latency prometheus.Histogram
}

// NewCollector returns the collector of cache. st, if not nil, is the Storage the cache was
// given (Config.Storage): its own counters (bytes, hits, corrupt values) are added.
func NewCollector(cache *hicache.Cache, labels Labels, st storage.Storage) *Collector {
	g := cache.Geometry() // fixed at New
	constants := labels.Labels()
	c := &Collector{
		cache: cache, st: st, pageSize: float64(g.PageSize),
		l1Pages: float64(g.L1Pages), l2Pages: float64(g.L2Pages),
		descs: make([]*prometheus.Desc, len(metricDefs)),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "cpcache", Name: "consensus_latency_seconds",
			Help:        "Wall time of the consensus step's collective (one AllReduce per Step).",
			Buckets:     ConsensusLatencyBuckets,
			ConstLabels: constants,
		}),
	}
	for i, d := range metricDefs {
		if d.storage && st == nil {
			continue
		}
		var variable []string
		if d.label != "" {
			variable = []string{d.label}
		}
		c.descs[i] = prometheus.NewDesc("cpcache_"+d.name, d.help, variable, constants)
	}
	return c
}

// metricDef is one exported family other than the histogram; value reads it from a
// snapshot, once per label value (or once, with no labels).
type metricDef struct {
	name, help string
	kind       prometheus.ValueType
	label      string   // the variable label ("" for none)
	values     []string // its values
	value      func(c *Collector, s *hicache.Stats, st *storage.Stats, i int) float64
	storage    bool // needs the Storage
}

var tiers = struct{ l1l2l3, l1l2, l2l3 []string }{
	[]string{"l1", "l2", "l3"}, []string{"l1", "l2"}, []string{"l2", "l3"},
}

// metricDefs are the exported families. Names follow the Prometheus conventions: the
// cpcache_ namespace, _total on counters, base units.
var metricDefs = []metricDef{
	{"hit_tokens_total", "Prompt tokens found in the cache at match time, by tier (l1: device, l2: host slabs only, l3: storage).",
		prometheus.CounterValue, "tier", tiers.l1l2l3, func(c *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return c.pageSize * float64([]int64{s.L1HitPages, s.L2HitPages, s.L3HitPages}[i])
		}, false},
	{"prompt_tokens_total", "Prompt tokens given to Match (every call: a request matched twice counts twice).",
		prometheus.CounterValue, "", nil, func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return float64(s.PromptTokens)
		}, false},
	{"missed_tokens_total", "Prompt tokens in neither L1 nor L2 at match time; storage hits (hit_tokens_total{tier=\"l3\"}) are found later among them.",
		prometheus.CounterValue, "", nil, func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return float64(s.MissedTokens)
		}, false},
	{"matches_total", "Match calls.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.Matches) }, false},
	{"inserted_pages_total", "Pages that got L1 slots from Insert.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.InsertedPages) }, false},
	{"pages_written_total", "Pages this rank wrote, by tier (l2: copied into its slab, l3: written to storage).",
		prometheus.CounterValue, "tier", tiers.l2l3, func(_ *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return float64([]int64{s.PagesWritten, s.StoragePagesWritten}[i])
		}, false},
	{"pages_loaded_total", "Pages this rank loaded, by tier (l2: copied back into L1, l3: read from storage).",
		prometheus.CounterValue, "tier", tiers.l2l3, func(_ *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return float64([]int64{s.PagesLoaded, s.StoragePagesRead}[i])
		}, false},
	{"pages_evicted_total", "Pages evicted, by tier.", prometheus.CounterValue, "tier", tiers.l1l2,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return float64([]int64{s.EvictedL1Pages, s.EvictedL2Pages}[i])
		}, false},
	{"backups_total", "Backups to L2, by outcome (committed pages, aborted, skipped for want of L2 space).",
		prometheus.CounterValue, "outcome", []string{"committed_pages", "aborted", "skipped"},
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return float64([]int64{s.WrittenPages, s.AbortedWrites, s.SkippedBackups}[i])
		}, false},
	{"failed_loads_total", "Load-backs from L2 that failed on some rank.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.FailedLoads) }, false},
	{"transfer_errors_total", "Page copies that failed on this rank.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return float64(s.TransferErrors)
		}, false},
	{"l1_used_pages", "L1 slots in use.", prometheus.GaugeValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.L1Used) }, false},
	{"l1_capacity_pages", "L1 slots in all.", prometheus.GaugeValue, "", nil,
		func(c *Collector, _ *hicache.Stats, _ *storage.Stats, _ int) float64 { return c.l1Pages }, false},
	{"l2_used_pages", "L2 pages in use, over every slab of the slab group.", prometheus.GaugeValue, "", nil,
		func(c *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return c.l2Pages - float64(s.L2FreePages)
		}, false},
	{"l2_capacity_pages", "L2 pages in all, over every slab of the slab group.", prometheus.GaugeValue, "", nil,
		func(c *Collector, _ *hicache.Stats, _ *storage.Stats, _ int) float64 { return c.l2Pages }, false},
	{"tree_nodes", "Radix tree nodes.", prometheus.GaugeValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.Nodes) }, false},
	{"steps_total", "Consensus steps applied.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.Steps) }, false},
	{"collectives_total", "Collectives this cache made (one per step, plus New and Flush).", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.Collectives) }, false},
	{"no_step_warnings_total", "Stretches in which copies or storage I/O stayed pending past the warning threshold with no step (they start only at a step).",
		prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return float64(s.NoStepWarnings)
		}, false},
	{"divergences_total", "Quarantines entered: steps whose digests differed across the replicas.",
		prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.Divergences) }, false},
	{"recoveries_total", "Agreed recovery flushes that ended a quarantine.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.Recoveries) }, false},
	{"quarantined_steps_total", "Steps applied in quarantine (no hits, inserts or slab I/O).", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return float64(s.QuarantinedSteps)
		}, false},
	{"quarantined", "1 while the group is in quarantine (after a divergence, until the recovery), else 0.", prometheus.GaugeValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			if s.Quarantined {
				return 1
			}
			return 0
		}, false},
	{"storage_errors_total", "Storage calls that failed on this rank (each a miss or a skipped backup).", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.StorageErrors) }, false},
	{"storage_circuit_open", "1 while the group agreed the storage circuit open (no prefetch or backup to storage), else 0.",
		prometheus.GaugeValue, "", nil, func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			if s.StorageCircuitOpen {
				return 1
			}
			return 0
		}, false},
	{"storage_circuit_open_seconds_total", "Time this rank's storage circuit breaker has been open in all.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return s.StorageCircuitOpenSeconds
		}, false},
	{"storage_queries_total", "Prefetch queries made to storage.", prometheus.CounterValue, "", nil,
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 { return float64(s.L3Queries) }, false},
	{"storage_prefetch_pages_total", "Pages storage had, by outcome (inserted into the tree, discarded after reading, skipped unread, of them skipped because computing them is faster).",
		prometheus.CounterValue, "outcome", []string{"prefetched", "discarded", "skipped", "skipped_for_cost"},
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return float64([]int64{s.L3PrefetchedPages, s.L3DiscardedPages, s.L3SkippedPrefetches, s.L3CostSkippedPages}[i])
		}, false},
	{"storage_read_bandwidth_bytes_per_second", "Read bandwidth of the slowest rank the group agreed (what the prefetch cost rule reads), 0 before any measurement.",
		prometheus.GaugeValue, "", nil, func(_ *Collector, s *hicache.Stats, _ *storage.Stats, _ int) float64 {
			return float64(s.StorageReadRate)
		}, false},
	{"storage_backups_total", "Backups to storage, by outcome (pages of backups every rank stored its part of, backups that failed).",
		prometheus.CounterValue, "outcome", []string{"stored_pages", "failed"},
		func(_ *Collector, s *hicache.Stats, _ *storage.Stats, i int) float64 {
			return float64([]int64{s.L3BackedUpPages, s.L3FailedBackups}[i])
		}, false},
	{"storage_bytes_total", "Payload bytes this rank's storage read (verified hits) and wrote.", prometheus.CounterValue,
		"direction", []string{"read", "written"}, func(_ *Collector, _ *hicache.Stats, st *storage.Stats, i int) float64 {
			return float64([]uint64{st.BytesRead, st.BytesWritten}[i])
		}, true},
	{"storage_gets_total", "Values this rank's storage looked up, by result (hit: verified, miss: absent).",
		prometheus.CounterValue, "result", []string{"hit", "miss"}, func(_ *Collector, _ *hicache.Stats, st *storage.Stats, i int) float64 {
			return float64([]uint64{st.Hits, st.Misses}[i])
		}, true},
	{"storage_rejected_values_total", "Stored values that failed verification (each a miss, deleted), by cause (forged: checksums held but the MAC or key did not; mismatched: genuine, but bound to other tokens or another parent page than the prefetch asked for; old_format: written in an older value format, e.g. before page ids were 256-bit; damaged: the rest).",
		prometheus.CounterValue, "cause", []string{"forged", "mismatched", "old_format", "damaged"}, func(_ *Collector, _ *hicache.Stats, st *storage.Stats, i int) float64 {
			// The storage loads its counters one by one: a snapshot taken while a value is
			// counted may hold a cause ahead of Corrupt.
			forged := min(st.Forged, st.Corrupt)
			mismatched := min(st.Mismatched, st.Corrupt-forged)
			old := min(st.OldFormat, st.Corrupt-forged-mismatched)
			return float64([]uint64{forged, mismatched, old, st.Corrupt - forged - mismatched - old}[i])
		}, true},
	{"storage_purged_values_total", "Values this rank's storage deleted because they failed verification.", prometheus.CounterValue, "", nil,
		func(_ *Collector, _ *hicache.Stats, st *storage.Stats, _ int) float64 { return float64(st.Purged) }, true},
	{"storage_evicted_values_total", "Values this rank's file store removed, by cause (capacity: to keep its directory within max_bytes, least recently used first; ttl: not used for longer than its ttl). Each is a later miss, never a bad page.",
		prometheus.CounterValue, "cause", []string{"capacity", "ttl"}, func(_ *Collector, _ *hicache.Stats, st *storage.Stats, i int) float64 {
			return float64([]uint64{st.Evicted, st.Expired}[i])
		}, true},
	{"storage_abandoned_operations_total", "Storage operations this rank's store stopped waiting for at their deadline, the kernel not having returned (a frozen or hung file system).",
		prometheus.CounterValue, "", nil,
		func(_ *Collector, _ *hicache.Stats, st *storage.Stats, _ int) float64 { return float64(st.Abandoned) }, true},
	{"storage_stuck_operations", "Of the abandoned storage operations, those still in the kernel now.", prometheus.GaugeValue, "", nil,
		func(_ *Collector, _ *hicache.Stats, st *storage.Stats, _ int) float64 { return float64(st.Stuck) }, true},
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		if d != nil {
			ch <- d
		}
	}
	c.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	// The snapshot and the histogram's update are one step under c.mu: a scrape that took
	// its snapshot before a concurrent one must not observe after it (its older snapshot
	// would count samples twice, or find fewer than were observed).
	c.mu.Lock()
	s := c.cache.Stats()
	fresh := min(s.ConsensusTimed-c.timed, int64(len(s.ConsensusLatency)))
	for _, d := range s.ConsensusLatency[int64(len(s.ConsensusLatency))-fresh:] {
		c.latency.Observe(d.Seconds())
	}
	c.timed = s.ConsensusTimed
	c.mu.Unlock()
	var st storage.Stats
	if c.st != nil {
		st = c.st.Stats()
	}
	for i, desc := range c.descs {
		if desc == nil {
			continue
		}
		d := &metricDefs[i]
		if d.label == "" {
			ch <- prometheus.MustNewConstMetric(desc, d.kind, d.value(c, &s, &st, 0))
			continue
		}
		for j, v := range d.values {
			ch <- prometheus.MustNewConstMetric(desc, d.kind, d.value(c, &s, &st, j), v)
		}
	}
	ch <- c.latency
}
