package hicache

import (
	"slices"
	"time"
)

// Stats are one rank's counters.
type Stats struct {
	CoreStats
	Collectives      int64           // collectives this cache made (one per Step, plus New and Flush)
	ConsensusLatency []time.Duration // recent consensus step latencies (AllReduce wall time), oldest first
	ConsensusTimed   int64           // consensus steps timed since New; ConsensusLatency holds the newest
	PagesWritten     int64           // pages this rank copied into its slab
	PagesLoaded      int64           // pages this rank copied back into L1
	TransferErrors   int64           // transfers that failed on this rank
	L1Used           int             // this rank's L1 slots in use (the pages it owns that L1 holds)
	L1UsedAll        int             // L1 slots in use on all CP ranks together (the tree's pages in L1)
	L2FreePages      int             // free L2 pages (all slabs)
	Nodes            int             // tree nodes
	Quarantined      bool            // the group is in quarantine: no hits, inserts or slab I/O
	Diverged         error           // the divergence error of the current quarantine, if any
	PlacementDigest  uint64          // the allocator's digest
	// NoStepWarnings: stretches in which transfers or storage operations stayed pending
	// longer than Config.StepWarnAfter with no Step (the first one is also logged).
	NoStepWarnings int64
	// L3 (storage). The CoreStats L3 fields are agreed; these are this rank's (every rank
	// does the storage I/O of the pages it owns: sum them over ranks for a group's).
	StorageHitTokens    int64 // tokens the group agreed were in storage (L3HitPages × page size)
	StorageErrors       int64 // storage calls that failed on this rank (each a miss or a skipped backup)
	StoragePagesRead    int64 // pages this rank read from storage (its own, verified)
	StoragePagesWritten int64 // pages this rank wrote to storage (pages already stored are skipped)
	// StorageAbandoned: storage operations this rank's store stopped waiting for at their
	// deadline because the kernel did not return (a frozen or hung file system; see
	// storage.Stats.Abandoned); StorageStuck: of them, those still in the kernel now.
	StorageAbandoned, StorageStuck int64
	// StorageCircuitOpen: the group agreed the storage circuit open (every rank alike): no
	// prefetch or backup to storage is queued (see L3Options.CircuitFailures).
	StorageCircuitOpen bool
	// StorageCircuitOpenSeconds: how long this rank's circuit breaker has been open in all.
	StorageCircuitOpenSeconds float64
	// StorageReadRate: the read bandwidth (bytes/s) of the slowest rank the group agreed
	// (every rank alike; 0 before any measurement); StorageReadRateLocal: this rank's own
	// measurement (an EWMA of its completed storage reads; non-zero once this rank has read from storage).
	StorageReadRate, StorageReadRateLocal int64
}

// Geometry is the fixed size of one rank's cache: what New configured, the same for every
// rank of a replica group.
type Geometry struct {
	PageSize int // tokens per page
	L1Pages  int // device pages (L1 slots) of each rank's pool: it holds the pages that rank owns
	L2Pages  int // host pages of the slab group (every slab)
}

// Geometry returns the cache's fixed size.
func (c *Cache) Geometry() Geometry {
	cfg := c.core.Config() // fixed at New
	return Geometry{PageSize: cfg.PageSize, L1Pages: cfg.L1Pages, L2Pages: cfg.Slabs * cfg.PagesPerSlab}
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchStepLocked() // a metrics scraper's Stats is a watchdog at no cost
	st := Stats{
		CoreStats:        c.core.Stats(),
		Collectives:      c.stats.collectives,
		ConsensusLatency: append(slices.Clone(c.stats.latencies[c.stats.next:]), c.stats.latencies[:c.stats.next]...),
		ConsensusTimed:   c.stats.timed,
		PagesWritten:     c.stats.pagesCopied[Write],
		PagesLoaded:      c.stats.pagesCopied[Load],
		TransferErrors:   c.stats.transferErrs,
		L1Used:           c.core.L1Used(),
		L1UsedAll:        c.core.L1UsedAll(),
		L2FreePages:      c.core.Allocator().TotalFree(),
		Nodes:            c.core.Nodes(),
		Quarantined:      c.core.Quarantined(),
		Diverged:         c.stats.diverged,
		PlacementDigest:  c.core.Allocator().Digest(),
		NoStepWarnings:   c.watch.count,

		StorageCircuitOpen: c.core.StorageCircuitOpen(),
		StorageReadRate:    c.core.StorageReadRateAgreed(),
	}
	st.StorageHitTokens = st.L3HitPages * int64(c.core.Config().PageSize)
	if c.l3 != nil {
		st.StorageErrors = c.l3.errs.Load()
		st.StoragePagesRead = c.l3.pagesRead.Load()
		st.StoragePagesWritten = c.l3.pagesWritten.Load()
		st.StorageCircuitOpenSeconds = c.l3.brk.openSeconds()
		st.StorageReadRateLocal = c.l3.rate.get()
		sst := c.l3.st.Stats()
		st.StorageAbandoned, st.StorageStuck = int64(sst.Abandoned), int64(sst.Stuck)
	}
	return st
}

// Quarantined reports whether the group is in quarantine (Stats.Quarantined, without the
// rest of the snapshot). Local.
func (c *Cache) Quarantined() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.Quarantined()
}

// StateDigest hashes the whole replicated state (see Core.StateDigest); equal on every rank
// of a healthy group between steps.
func (c *Cache) StateDigest() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.StateDigest()
}
