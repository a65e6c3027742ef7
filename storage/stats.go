package storage

import "sync/atomic"

// Stats are cumulative counters of one Storage.
type Stats struct {
	Hits         uint64 // Get: verified values read
	Misses       uint64 // Get: keys absent (corrupt values are counted in Corrupt, not here)
	Corrupt      uint64 // Get: values that failed verification and were treated as misses
	Puts         uint64 // values stored
	Deletes      uint64 // keys deleted (whether or not they existed)
	BytesRead    uint64 // payload bytes of verified hits
	BytesWritten uint64 // payload bytes stored
	Errors       uint64 // calls that returned an error
}

// counters is the live, atomically updated form of Stats.
type counters struct {
	hits, misses, corrupt, puts, deletes, bytesRead, bytesWritten, errors atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Hits:         c.hits.Load(),
		Misses:       c.misses.Load(),
		Corrupt:      c.corrupt.Load(),
		Puts:         c.puts.Load(),
		Deletes:      c.deletes.Load(),
		BytesRead:    c.bytesRead.Load(),
		BytesWritten: c.bytesWritten.Load(),
		Errors:       c.errors.Load(),
	}
}

// fail counts err (if non-nil) and returns it.
func (c *counters) fail(err error) error {
	if err != nil {
		c.errors.Add(1)
	}
	return err
}
