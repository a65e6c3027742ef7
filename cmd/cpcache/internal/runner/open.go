package runner

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// jobConfig is the job.Config of the run's rank rank: the plan's layout, capacities and
// policy, its consensus backend and timeouts, its storage (opened as openStorage opens it,
// wrapped with the rank's storage faults, cleared with --storage-clear) and the rank's cache
// faults. The caller sets where the rank meets the others and its memory (memory.jobMemory).
func (p *Plan) jobConfig(rank int) job.Config {
	cfg := &p.Config
	jc := job.Config{
		Store: cfg.Store, Timeout: cfg.Timeout,
		// A consensus step waits at most a minute (or --timeout when shorter) for a stuck
		// peer; rendezvous and the final gather, which waits for the slowest replica, get
		// --timeout.
		StepTimeout: min(cfg.Timeout, parallel.DefaultTimeout),
		Layout:      p.Layout.Config, PageTokens: cfg.PageSize, PageBytes: cfg.PageBytes(),
		L1Pages: cfg.L1Pages, L2Pages: cfg.L2Pages, Options: hicache.Options{Policy: cfg.Policy},
		Consensus: cfg.Consensus, Tag: "cpcache-run", KVLayout: p.KVLayout, SeparateSlabs: cfg.SeparateL2,
		SlabLayout:     fmt.Sprintf("kv %d B/token, %d tokens/page", cfg.KVBytesPerToken, cfg.PageSize),
		LatencySamples: 1 << 16, // the latest 64 K steps of each rank (Stats copies them)
		Faults:         cfg.cacheFaults(rank),
	}
	if cfg.Storage != "" {
		jc.StorageURL, jc.StorageModel = cfg.Storage, cfg.storageModelName()
		jc.StorageOptions = p.storageOptions(p.storageWarning)
		jc.StorageTimeout = storageOpenTimeout
		jc.StorageError = func(err error) error { return p.storageError(storageHint(err)) }
		jc.WrapStorage = func(st storage.Storage) storage.Storage { return cfg.faultyStorage(rank, st) }
		jc.L3 = cfg.l3Options()
		if cfg.StorageClear {
			jc.ClearStorage = func(ctx context.Context, st storage.Storage) error { return clearStorage(ctx, st, cfg.Storage) }
		}
	}
	if cfg.KVEvents != "" {
		// The replica's leader publishes (job.Rank.Events); every rank's cache records events.
		jc.KVEvents = cfg.kvEventsConfig()
		jc.KVEventsLog = func(err error) { fmt.Fprintf(os.Stderr, "cpcache: rank %d: %v\n", rank, err) }
	}
	return jc
}

// openRank opens this process's rank of the run (job.Open): the launcher placed it (env),
// the ranks first compare their flags, and the L2 is host shared-memory slabs or, with
// --device cuda, the device memory of mem. The job's input errors wrap ErrBadInput.
func (p *Plan) openRank(ctx context.Context, env parallel.Env, mem *memory) (*job.Rank, error) {
	cfg := &p.Config
	jc := p.jobConfig(env.Rank)
	var err error
	jc.Start = func(ctx context.Context, world parallel.Group, _ *hicache.Options) error {
		return agreeStartFlags(ctx, world, p.startFlags())
	}
	jc.BeforeSlabs = func() { cfg.killPoint(env.Rank, "slabs", 0) }
	mem.jobMemory(&jc, env.LocalRank)
	if mem.kvL1, err = p.kvMemory(&jc); err != nil {
		return nil, err
	}
	rk, err := job.Open(ctx, jc)
	if err != nil {
		return nil, openError(err)
	}
	mem.opened(rk)
	return rk, nil
}

// openError is job.Open's error as the run reports it: what the job's input decides (a store
// another job uses, ranks started with different storages or keys, a bad value) wraps
// ErrBadInput and names the flag.
func openError(err error) error {
	switch {
	case errors.Is(err, gloo.ErrStoreInUse):
		// Another job joins through the same --store with the same job id (or none): the
		// job's input, not a failure of this run, and it fails before the run starts.
		return fmt.Errorf("%w: --store: %w", ErrBadInput, err)
	case errors.Is(err, job.ErrMismatch):
		return bad("--storage, --storage-key-file: %w", err)
	case errors.Is(err, job.ErrBadValue) && !errors.Is(err, ErrBadInput):
		return fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return err
}
