package hicache

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/storage"
)

// l3Driver runs this rank's share of the core's storage jobs (the pages it owns) with this
// rank's storage handle: each job is a goroutine (at most
// Workers storage calls at once) whose completion is a local event reported to the core at
// the next Step. Nothing here changes replicated state.
type l3Driver struct {
	st    storage.Storage
	ns    storage.Namespace
	shard uint32 // tensor-parallel index of the slab group: part of every key
	slabs HostSlabs
	// layerFirst, when set, is the L2 in kvmem.LayerFirst layout: a page's chunks are spread
	// over its slab, and the driver converts to and from the page-first bytes that are the L3
	// value. nil: pages are page-first (or opaque) and go to storage as they lie.
	layerFirst *layerFirstL2
	opts       L3Options
	// skip: this rank reads a shared slab it does not write (Config.ShareSlabs): every job is
	// its writer's, so it finishes at once with all its pages, without a storage call.
	skip bool
	sem  chan struct{}
	wg   sync.WaitGroup
	brk  *breaker

	mu          sync.Mutex // protects running, finished and probeCancel
	running     map[l3Key]*l3Run
	finished    []*l3Run
	probeCancel context.CancelFunc // stops the running probe (nil: none yet)

	rate readRate // this rank's read bandwidth, measured from its completed storage reads

	errs         atomic.Int64 // storage errors on this rank
	pagesRead    atomic.Int64 // pages this rank read from storage (verified)
	pagesWritten atomic.Int64 // pages this rank wrote to storage
}

type l3Key struct {
	kind core.StorageKind
	seq  uint64
}

// l3Run is one job in flight.
type l3Run struct {
	job      core.StorageJob
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time    // PrefetchTimeout: when this rank asks to cut the read
	progress atomic.Int64 // read: leading pages verified so far
	n        int          // result, set before the run is finished
	err      error
}

func newL3Driver(st storage.Storage, ns storage.Namespace, shard int, slabs HostSlabs, opts L3Options) *l3Driver {
	return &l3Driver{st: st, ns: ns, shard: uint32(shard), slabs: slabs, opts: opts,
		sem: make(chan struct{}, opts.Workers), running: map[l3Key]*l3Run{}, brk: newBreaker(&opts)}
}

// key is the storage key of the page with id h: the namespace, the full 256-bit id and the
// slab group's tensor-parallel index (TP shards hold different bytes for one prefix).
func (d *l3Driver) key(h core.PageID) storage.Key { return storage.PageKey(d.ns, h, d.shard) }

// binds converts a job's bindings to the storage's.
func binds(bs []core.Binding) []storage.Binding {
	out := make([]storage.Binding, len(bs))
	for i, b := range bs {
		out[i] = storage.Binding{Tokens: b.Tokens, Parent: b.Parent}
	}
	return out
}

func (d *l3Driver) keys(hashes []core.PageID) []storage.Key {
	out := make([]storage.Key, len(hashes))
	for i, h := range hashes {
		out[i] = d.key(h)
	}
	return out
}

// start runs job in the background.
func (d *l3Driver) start(job core.StorageJob) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &l3Run{job: job, ctx: ctx, cancel: cancel}
	if job.Kind != core.StoragePut {
		r.deadline = time.Now().Add(prefetchTimer(d.opts.PrefetchTimeoutBase, d.opts.PrefetchTimeoutPerPage, len(job.Hashes)))
	}
	if d.skip {
		r.n = len(job.Hashes)
		cancel()
		d.mu.Lock()
		d.finished = append(d.finished, r)
		d.mu.Unlock()
		return
	}
	d.mu.Lock()
	d.running[l3Key{job.Kind, job.Seq}] = r
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		select {
		case d.sem <- struct{}{}:
			r.n, r.err = d.run(r)
			<-d.sem
		case <-ctx.Done():
			r.err = ctx.Err()
		}
		cancel()
		d.mu.Lock()
		delete(d.running, l3Key{job.Kind, job.Seq})
		d.finished = append(d.finished, r)
		d.mu.Unlock()
	}()
}

// readRate is an exponentially weighted moving average of the bandwidth of a rank's storage
// reads (bytes/s, each completed Get weighing by its bytes against the last rateWindow of
// them). Local: the group agrees on it only through the vector (core.StorageReadRate).
type readRate struct {
	mu  sync.Mutex
	bps float64 // 0 until the first read
}

// rateWindow is how many bytes of reads the average mostly reflects: a read of w bytes
// moves it by w/(w+rateWindow) toward its own rate.
const rateWindow = 64 << 20

func (r *readRate) add(bytes int64, d time.Duration) {
	if bytes <= 0 {
		return
	}
	bps := float64(bytes) / max(d.Seconds(), 1e-9)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bps == 0 {
		r.bps = bps
		return
	}
	w := float64(bytes) / float64(bytes+rateWindow)
	r.bps += w * (bps - r.bps)
}

// get is the average, rounded to 1% steps (3 significant digits of bytes/s): the group
// agrees a new value only when the bandwidth really moved, not at every read.
func (r *readRate) get() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bps <= 0 {
		return 0
	}
	scale := math.Pow(10, math.Floor(math.Log10(r.bps))-2)
	return int64(math.Round(r.bps/scale) * scale)
}

// prefetchTimer is base + pages × perPage (both non-negative), or the largest Duration when
// that does not fit: a sum that wrapped negative would cut every read at once.
func prefetchTimer(base, perPage time.Duration, pages int) time.Duration {
	const maxDuration = time.Duration(math.MaxInt64)
	if pages > 0 && perPage > (maxDuration-base)/time.Duration(pages) {
		return maxDuration
	}
	return base + time.Duration(pages)*perPage
}

// stop cancels a read the group cut short.
func (d *l3Driver) stop(seq uint64) {
	d.mu.Lock()
	r := d.running[l3Key{core.StorageRead, seq}]
	d.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// poll appends finished jobs and the progress of running reads to done (stopping queries
// past their PrefetchTimeout timer: misses), and probes the store when the circuit breaker
// is open and a probe is due.
func (d *l3Driver) poll(done *core.Done) {
	d.startProbe()
	d.mu.Lock()
	finished := d.finished
	d.finished = nil
	var waiting []*l3Run
	for k, r := range d.running {
		if k.kind != core.StoragePut {
			waiting = append(waiting, r)
		}
	}
	d.mu.Unlock()
	for _, r := range finished {
		done.Storage = append(done.Storage, core.StorageDone{Kind: r.job.Kind, Seq: r.job.Seq, Pages: r.n, Err: r.err})
	}
	now := time.Now()
	for _, r := range waiting {
		cut := d.opts.PrefetchPolicy == core.PrefetchTimeout && now.After(r.deadline)
		if r.job.Kind == core.StorageQuery {
			if cut {
				// Too slow to wait for: a miss, and nobody waits for the call any more (it
				// would hold a worker, or run later, for nothing).
				done.Storage = append(done.Storage, core.StorageDone{Kind: core.StorageQuery, Seq: r.job.Seq})
				r.cancel()
			}
			continue
		}
		done.Progress = append(done.Progress, core.StorageProgress{Seq: r.job.Seq, Pages: int(r.progress.Load()), Cut: cut})
	}
}

// drain cancels every job, waits for them and forgets their results.
func (d *l3Driver) drain() {
	if d == nil {
		return
	}
	d.mu.Lock()
	for _, r := range d.running {
		r.cancel()
	}
	if d.probeCancel != nil {
		d.probeCancel()
	}
	d.mu.Unlock()
	d.wg.Wait()
	d.mu.Lock()
	d.finished = nil
	d.mu.Unlock()
}

// fail counts and logs a storage error (the first ten, then every hundredth).
func (d *l3Driver) fail(err error) {
	n := d.errs.Add(1)
	if n > 10 && n%100 != 0 {
		return
	}
	if n > 10 {
		err = fmt.Errorf("%w (%d storage errors so far)", err, n)
	}
	if d.opts.Log != nil {
		d.opts.Log(err)
		return
	}
	log.Print(err)
}

func (d *l3Driver) sleep(ctx context.Context, kind core.StorageKind, seq uint64, chunk int) error {
	if d.opts.hook == nil {
		return ctx.Err()
	}
	return d.opts.hook(ctx, kind, seq, chunk)
}

// run executes one job and returns its result (see core.StorageDone). Storage errors are
// counted and logged here; a canceled read is not an error.
func (d *l3Driver) run(r *l3Run) (int, error) {
	job := r.job
	ctx := r.ctx
	keys := d.keys(job.Hashes)
	wrap := func(err error) error {
		err = fmt.Errorf("hicache: storage %s %d: %w", job.Kind, job.Seq, err)
		if !errors.Is(err, ErrStorageCircuitOpen) {
			d.fail(err)
		}
		return err
	}
	switch job.Kind {
	case core.StorageQuery:
		if err := d.sleep(ctx, job.Kind, job.Seq, 0); err != nil {
			return 0, err
		}
		var n int
		err := d.call(ctx, func(ctx context.Context) (err error) { n, err = d.st.Exists(ctx, keys, nil); return err })
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil // stopped by its timer: a miss already
			}
			return 0, wrap(err) // a miss
		}
		return n, nil
	case core.StoragePut:
		if err := d.sleep(ctx, job.Kind, job.Seq, 0); err != nil {
			return 0, err
		}
		present := make([]bool, len(keys))
		if err := d.call(ctx, func(ctx context.Context) error { _, err := d.st.Exists(ctx, keys, present); return err }); err != nil {
			return 0, wrap(err)
		}
		var put []storage.Key
		var putBinds []storage.Binding
		var src [][]byte
		all := binds(job.Binds)
		for i, p := range job.Pages {
			if present[i] {
				continue
			}
			b, err := d.slabs.Page(p)
			if err == nil && d.layerFirst != nil {
				b, err = d.layerFirst.read(p)
			}
			if err != nil {
				return 0, wrap(err)
			}
			put, src = append(put, keys[i]), append(src, b)
			putBinds = append(putBinds, all[i])
		}
		if len(put) > 0 {
			if err := d.call(ctx, func(ctx context.Context) error { return d.st.PutBound(ctx, put, putBinds, src) }); err != nil {
				return 0, wrap(fmt.Errorf("backup of node %d: %w", job.Node, err))
			}
		}
		d.pagesWritten.Add(int64(len(put)))
		return len(job.Pages), nil
	case core.StorageRead:
		// GetBound checks each value's binding (its page's tokens and parent, which this
		// rank computed from the tokens it asked for): a value stored for anything else is
		// a miss, counted in the storage's Stats.Mismatched, never loaded.
		want := binds(job.Binds)
		chunk := d.opts.ReadChunkPages
		done := 0
		for lo := 0; lo < len(keys); lo += chunk {
			hi := min(lo+chunk, len(keys))
			if err := d.sleep(ctx, job.Kind, job.Seq, lo/chunk); err != nil {
				return done, nil // cut by the group
			}
			dst := make([][]byte, hi-lo)
			for i := range dst {
				b, err := d.slabs.Page(job.Pages[lo+i])
				if err != nil {
					return done, wrap(err)
				}
				if d.layerFirst != nil { // read page-first bytes, then place them
					b = make([]byte, len(b))
				}
				dst[i] = b
			}
			found := make([]bool, hi-lo)
			var n int
			before := d.st.Stats()
			began := time.Now()
			err := d.call(ctx, func(ctx context.Context) (err error) {
				n, err = d.st.GetBound(ctx, keys[lo:hi], want[lo:hi], dst, found)
				return err
			})
			if d.layerFirst != nil {
				for i, ok := range found {
					if ok {
						if werr := d.layerFirst.write(job.Pages[lo+i], dst[i]); werr != nil && err == nil {
							err = werr
						}
					}
				}
			}
			if err == nil && n > 0 {
				d.rate.add(int64(n)*int64(len(dst[0])), time.Since(began))
			}
			done += n
			r.progress.Store(int64(done))
			d.pagesRead.Add(int64(n))
			if err != nil {
				if ctx.Err() != nil && errors.Is(err, context.Canceled) {
					return done, nil
				}
				return done, wrap(err)
			}
			if n < hi-lo {
				// The group agreed these pages were stored: one vanished or failed
				// verification (torn, foreign, checksum). A page that vanished was
				// evicted or expired since the group's query (a store's capacity or TTL,
				// Redis's maxmemory, another job's flush): a miss, counted by the store
				// (Stats.Misses), not an error. The store tells them apart: it counts
				// every value that failed verification before GetBound returns. (Another
				// read of this store failing verification meanwhile makes a vanished
				// page an error too: the conservative side.)
				if d.st.Stats().Corrupt == before.Corrupt {
					return done, nil
				}
				// A miss, and an error. Deleting the value lets a later backup of the
				// page replace it.
				bad := keys[lo+n]
				err := fmt.Errorf("page %d of %d (key %s) failed verification: %w", lo+n, len(keys), bad, storage.ErrCorrupt)
				if derr := d.call(ctx, func(ctx context.Context) error { return d.st.Delete(ctx, []storage.Key{bad}) }); derr != nil {
					err = fmt.Errorf("%w; deleting it: %v", err, derr)
				}
				return done, wrap(err)
			}
		}
		return done, nil
	}
	return 0, nil
}

// layerFirstL2 converts between a layer-first L2's pages and their page-first bytes.
type layerFirstL2 struct {
	shape *kvmem.Shape
	mem   engine.HostSlabMemory
}

// read returns page p's page-first bytes (a fresh buffer).
func (l *layerFirstL2) read(p slab.Page) ([]byte, error) {
	m, err := l.mem.SlabMemory(p.Slab)
	if err != nil {
		return nil, err
	}
	b := make([]byte, l.shape.PageBytes())
	return b, l.shape.ReadPageFirst(b, kvmem.LayerFirst, m, l.mem.PagesPerSlab(), p.Index)
}

// write places page-first bytes b at page p.
func (l *layerFirstL2) write(p slab.Page, b []byte) error {
	m, err := l.mem.SlabMemory(p.Slab)
	if err != nil {
		return err
	}
	return l.shape.WritePageFirst(b, kvmem.LayerFirst, m, l.mem.PagesPerSlab(), p.Index)
}
