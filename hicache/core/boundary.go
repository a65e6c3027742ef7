package core

// The core's one boundary with its driver, in the spirit of raft's Ready/Advance:
//
//	Ready   hands the driver the work made since the last call (transfers to start, storage
//	        jobs to start and reads to stop);
//	Vector  fills, once per step, this rank's consensus vector;
//	Report  takes this rank's local completions (transfers and storage jobs finished,
//	        storage read progress);
//	Apply   takes the agreed (all-reduced) vector and changes replicated state.
//
// The driver never reads the core's fields; everything it needs goes through these calls
// and the read-only accessors (Config, Stats, Node, Loading, ...). Nodes cross it as Handles
// (see Handle) and copies of their state (NodeInfo, MatchResult, InsertResult), never as
// the tree's own nodes.

// Ready is the work the core hands its driver.
type Ready struct {
	// Transfers are L1↔L2 copies to start, in the order they were made.
	Transfers []Transfer
	// Jobs are this rank's shares of storage work to start (the pages it owns).
	Jobs []StorageJob
	// Stops are the seqs of storage reads the group cut short: this rank's I/O on them must
	// stop.
	Stops []uint64
}

// Ready returns the work made since the last call and forgets it. A driver calls it at a
// step before Vector (the work made by the step's scheduler calls) and after Apply (the
// work Apply made), and starts both only after Apply.
func (c *Core) Ready() Ready {
	rd := Ready{Transfers: c.out, Jobs: c.l3.jobs, Stops: c.l3.stops}
	c.out, c.l3.jobs, c.l3.stops = nil, nil, nil
	return rd
}

// Vector fills v (of length VectorLen) with this rank's contribution to the step's
// consensus and returns it: the driver all-reduces it with MIN over the replica group and
// passes the result to Apply. Call it once per step, after the step's scheduler calls,
// Report and Ready.
func (c *Core) Vector(v []int64) []int64 {
	if len(v) != VectorLen {
		panic("core: consensus vector buffer of wrong length")
	}
	return c.fillVector(v)
}

// Done is the set of local completions a driver reports at once (see Report).
type Done struct {
	Transfers []TransferDone
	Storage   []StorageDone
	Progress  []StorageProgress
}

// TransferDone: this rank finished a transfer (Err != nil: it failed).
type TransferDone struct {
	Kind Kind
	Seq  uint64
	Err  error
}

// StorageDone: this rank's storage job finished: a backup (Err: it failed), a query
// (Pages leading pages of the job stored) or a read (Pages leading pages of the job read
// and verified; its I/O has stopped). Pages count the job's pages, this rank's own.
type StorageDone struct {
	Kind  StorageKind
	Seq   uint64
	Pages int
	Err   error
}

// StorageProgress: a storage read still running has completed Pages leading pages of its
// job (this rank's own); Cut
// says this rank's timer asks the group to cut it (PrefetchTimeout).
type StorageProgress struct {
	Seq   uint64
	Pages int
	Cut   bool
}

// Report records local completions: transfers first, then finished storage jobs, then the
// progress of running reads. Local events: they change only what this rank contributes to
// the next vector, and take effect through the next Apply. Unknown seqs are ignored (work
// dropped by a divergence or a flush).
func (c *Core) Report(d Done) {
	for _, t := range d.Transfers {
		c.completed(t.Kind, t.Seq, t.Err)
	}
	for _, s := range d.Storage {
		c.l3Done(s.Kind, s.Seq, s.Pages, s.Err)
	}
	for _, p := range d.Progress {
		c.l3Progress(p.Seq, p.Pages, p.Cut)
	}
}
