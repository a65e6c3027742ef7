package core

import (
	"fmt"
	"hash/fnv"
)

// Policy says when an L1 node is backed up into L2.
type Policy int

// Write policies.
const (
	// WriteThrough backs a node up on its first hit (its insertion).
	WriteThrough Policy = iota
	// WriteThroughSelective backs a node up once it has been inserted WriteThreshold times.
	WriteThroughSelective
	// WriteBack backs a node up only when it is evicted from L1; its L1 pages are freed once
	// the group agreed the backup completed.
	WriteBack
)

func (p Policy) String() string {
	switch p {
	case WriteThrough:
		return "write_through"
	case WriteThroughSelective:
		return "write_through_selective"
	case WriteBack:
		return "write_back"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy parses the names String returns.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range []Policy{WriteThrough, WriteThroughSelective, WriteBack} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown write policy %q (want write_through, write_through_selective or write_back)", ErrBadConfig, s)
}

// L1Mode says who picks the L1 slots of the pages the cache holds.
type L1Mode uint8

const (
	// CacheOwned: the cache picks the slots (Insert, LoadBack return them; lowest free first).
	CacheOwned L1Mode = iota
	// EngineOwned: the engine's allocator picks them. The engine computes a sequence's KV into
	// its own slots and inserts the sequence with them (InsertSlots); a load-back takes its
	// destination slots from the engine (LoadBackSlots); every slot the cache lets go comes
	// back to the engine exactly once: in the result of the call that freed it (InsertSlots,
	// LoadBackSlots, EvictL1Slots) or, for releases outside such a call (a write-back eviction
	// committing, quarantine, recovery, Reset), through TakeFreedL1. The per-rank counts of
	// slots in use are replicated (in the digests); the slot values are local to each rank.
	EngineOwned
)

func (m L1Mode) String() string {
	switch m {
	case CacheOwned:
		return "cache_owned"
	case EngineOwned:
		return "engine_owned"
	}
	return fmt.Sprintf("L1Mode(%d)", uint8(m))
}

// Options are the cache's tunables. They must be identical on every rank of the group (the
// consensus step checks a fingerprint of them).
type Options struct {
	PageSize       int    // tokens per page (default 16)
	L1Pages        int    // pages in each rank's device KV pool (required)
	Policy         Policy // write policy (default WriteThrough)
	WriteThreshold int    // WriteThroughSelective: insertions before a backup (default 2)
	MinLoadPages   int    // load back only host hits of at least this many pages (default 1)
	LoadQuotaPages int    // at most this many pages loading at once (default: half of the CP group's L1, C×L1Pages/2)
	L1Mode         L1Mode // who picks L1 slots (default CacheOwned)
	// Generation is the handle generation before the first tree: the first tree's handles
	// have Generation+1, and every reset moves it on by one (see Handle). A process that
	// opens caches one after another starts each above the last one's Core.Generation, so
	// that no handle of a closed cache names a node of the next one. Equal on every rank.
	Generation uint64
}

func (o *Options) normalize() error {
	if o.PageSize == 0 {
		o.PageSize = 16
	}
	if o.WriteThreshold == 0 {
		o.WriteThreshold = 2
	}
	if o.MinLoadPages == 0 {
		o.MinLoadPages = 1
	}
	if o.LoadQuotaPages == 0 {
		o.LoadQuotaPages = max(1, o.L1Pages/2)
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"page size", o.PageSize}, {"L1 pages", o.L1Pages}, {"write threshold", o.WriteThreshold},
		{"min load pages", o.MinLoadPages}, {"load quota pages", o.LoadQuotaPages}} {
		if v.v <= 0 {
			return fmt.Errorf("%w: %s %d must be positive", ErrBadConfig, v.name, v.v)
		}
	}
	if o.L1Pages > 1<<31-1 {
		return fmt.Errorf("%w: L1 pages %d must be below 2^31", ErrBadConfig, o.L1Pages)
	}
	if o.L1Mode != CacheOwned && o.L1Mode != EngineOwned {
		return fmt.Errorf("%w: L1 mode %d", ErrBadConfig, int(o.L1Mode))
	}
	if o.Policy < WriteThrough || o.Policy > WriteBack {
		return fmt.Errorf("%w: write policy %d", ErrBadConfig, int(o.Policy))
	}
	return nil
}

// Config configures the deterministic core of one rank.
type Config struct {
	Options
	Slabs        int // C: slabs in the slab group (= attention-CP size)
	PagesPerSlab int // L2 pages in each slab
	CPRank       int // this rank's index in the slab group: it owns sequence pages i with i mod C == CPRank
	// Fingerprint is mixed into the configuration fingerprint the consensus step checks
	// (the driver puts the group's ranks and the page size in bytes here).
	Fingerprint uint64
	// L3 enables the storage tier's protocol (backups to storage, prefetches from it);
	// L3Config tunes it. Every rank stores and reads the pages it owns (those of its slab).
	L3       bool
	L3Config L3Config
}

func (c *Config) normalize() error {
	if c.LoadQuotaPages == 0 && c.Slabs > 0 && c.L1Pages > 0 {
		// Every rank's pool holds the pages it owns: the group's L1 is C pools.
		c.LoadQuotaPages = max(1, c.Slabs*c.L1Pages/2)
	}
	if err := c.Options.normalize(); err != nil {
		return err
	}
	if c.Slabs <= 0 || c.PagesPerSlab <= 0 || c.PagesPerSlab > 1<<31-1 {
		return fmt.Errorf("%w: L2 shape %d slabs × %d pages (both must be positive, pages below 2^31)", ErrBadConfig, c.Slabs, c.PagesPerSlab)
	}
	if c.CPRank < 0 || c.CPRank >= c.Slabs {
		return fmt.Errorf("%w: CP rank %d outside 0..%d", ErrBadConfig, c.CPRank, c.Slabs-1)
	}
	if c.L3 {
		if c.L3Config.Cost.IORanks == 0 {
			c.L3Config.Cost.IORanks = c.Slabs // every CP rank reads the pages it owns
		}
		return c.L3Config.normalize(c.Slabs * c.PagesPerSlab)
	}
	return nil
}

// fingerprint hashes everything that must be equal on every rank (not CPRank).
func (c *Config) fingerprint() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%d|%d|%d|%d|%d|%d|%d|%x", c.PageSize, c.L1Pages, c.Policy, c.WriteThreshold,
		c.MinLoadPages, c.LoadQuotaPages, c.Slabs, c.PagesPerSlab, c.Fingerprint)
	if c.L1Mode != CacheOwned {
		fmt.Fprintf(h, "|l1mode|%d", c.L1Mode)
	}
	if c.L3 {
		fmt.Fprintf(h, "|l3|%s", c.L3Config.fingerprint())
	}
	return h.Sum64()
}
