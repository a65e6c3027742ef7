package storage

import "sync/atomic"

// Stats are cumulative counters of one Storage.
type Stats struct {
	Hits         uint64 // Get: verified values read
	Misses       uint64 // Get: keys absent (corrupt values are counted in Corrupt, not here)
	Corrupt      uint64 // values that failed verification: misses, deleted (Get; Exists on file stores)
	Forged       uint64 // of Corrupt: values whose checksums held but whose MAC or key did not (ErrForged)
	Purged       uint64 // values deleted because they failed verification
	Puts         uint64 // values stored
	Deletes      uint64 // keys deleted (whether or not they existed)
	BytesRead    uint64 // payload bytes of verified hits
	BytesWritten uint64 // payload bytes stored
	Errors       uint64 // calls that returned an error
	Links        uint64 // directory store: symbolic links met under it (each time), not followed (ErrLink)
	// Abandoned: file system operations (directory backend) whose call stopped waiting for
	// them at its deadline, the kernel not having returned; Stuck: of them, those still in
	// the kernel now (a gauge). See ErrStuck and Options.MaxStuck.
	Abandoned uint64
	Stuck     uint64
}

// counters is the live, atomically updated form of Stats.
type counters struct {
	hits, misses, corrupt, forged, purged, puts, deletes, bytesRead, bytesWritten, errors, links atomic.Uint64
}

func (c *counters) snapshot() Stats {
	// Forged before Corrupt: a forged value adds to Corrupt first, so Forged <= Corrupt
	// holds in every snapshot.
	forged := c.forged.Load()
	return Stats{
		Hits:         c.hits.Load(),
		Misses:       c.misses.Load(),
		Corrupt:      c.corrupt.Load(),
		Forged:       forged,
		Purged:       c.purged.Load(),
		Puts:         c.puts.Load(),
		Deletes:      c.deletes.Load(),
		BytesRead:    c.bytesRead.Load(),
		BytesWritten: c.bytesWritten.Load(),
		Errors:       c.errors.Load(),
		Links:        c.links.Load(),
	}
}

// fail counts err (if non-nil) and returns it.
func (c *counters) fail(err error) error {
	if err != nil {
		c.errors.Add(1)
	}
	return err
}
