package storage

// Stats are cumulative counters of one Storage.
type Stats struct {
	Hits         uint64 // Get: verified values read
	Misses       uint64 // Get: keys absent (corrupt values are counted in Corrupt, not here)
	Corrupt      uint64 // values that failed verification: misses, deleted (Get; Exists on file stores)
	Forged       uint64 // of Corrupt: values whose checksums held but whose MAC or key did not (ErrForged)
	Mismatched   uint64 // of Corrupt: genuine values bound to other tokens or another parent than asked for (ErrMismatch)
	OldFormat    uint64 // of Corrupt: values of an older format version (ErrOldFormat), e.g. written before page ids were 256-bit
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
	// Evicted: values this storage removed to keep its directory within its capacity
	// (file store's max_bytes), least recently used first and a chain's later pages before
	// its earlier ones; Expired: values it removed because they were not used for longer
	// than its TTL (file store's ttl). Each is a later miss, never a bad page.
	Evicted uint64
	Expired uint64
}
