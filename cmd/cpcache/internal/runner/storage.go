package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// storageModel names the KV content of a run in its storage namespace: kvtest's page
// bytes, a function of the page's id (its 64-bit index), position and TP shard. The page size in
// tokens and bytes and the attention-TP size are added by hicache.NewStorageNamespace, so
// runs with different page sizes, KV sizes or TP shapes never read each other's pages;
// runs that differ only in CP or DP size share them (a page's bytes do not depend on them).
// With --model the layout's fingerprint is added too.
const storageModel = "cpcache-run/kvtest-v1"

// storageModelName is the run's storageModel: with --engine model the pages are the
// reference model's KV (of its variant and seed), never read by a kvtest run of the same
// layout nor by a model of other weights.
func (c *Config) storageModelName() string {
	if c.Engine == EngineModel {
		return "cpcache-run/refmodel-v1/" + c.ModelVariant
	}
	return storageModel
}

// storageOpenTimeout bounds opening (and, with Config.StorageClear, clearing) the storage.
const storageOpenTimeout = 30 * time.Second

// ParsePrefetchPolicy parses a --prefetch-policy value: best-effort, wait-complete or
// timeout (hicache's underscore spellings are accepted too).
func ParsePrefetchPolicy(s string) (hicache.PrefetchPolicy, error) {
	p, err := hicache.ParsePrefetchPolicy(strings.ReplaceAll(s, "-", "_"))
	if err != nil {
		return 0, bad("prefetch policy %q (want best-effort, wait-complete or timeout)", s)
	}
	return p, nil
}

// StorageNamespace is the namespace of the run's pages in its L3 storage.
func (p *Plan) StorageNamespace() (storage.Namespace, error) {
	return hicache.NewStorageNamespace(p.Config.storageModelName(), p.Layout, p.Config.PageSize, p.Config.PageBytes(), p.KVLayout)
}

func (p *Plan) openStorageRaw(ctx context.Context, onWarning func(error)) (storage.Storage, storage.Namespace, error) {
	if p.Config.Storage == "" {
		return nil, storage.Namespace{}, nil
	}
	ns, err := p.StorageNamespace()
	if err != nil {
		return nil, ns, err
	}
	ctx, cancel := context.WithTimeout(ctx, storageOpenTimeout)
	defer cancel()
	opts := p.storageOptions(onWarning)
	opts.Namespace = ns
	st, err := stores.Open(ctx, p.Config.Storage, opts)
	return st, ns, storageHint(err)
}

// storageOptions are the options every rank opens the run's storage with (the namespace
// aside).
func (p *Plan) storageOptions(onWarning func(error)) storage.Options {
	return storage.Options{MACKeyFile: p.Config.StorageKeyFile, Insecure: p.Config.StorageInsecure, OnWarning: onWarning}
}

// storageWarning prints what a rank's storage warns of (the links it finds under a file
// store, storage.ErrLink) to stderr; the store's mode was reported by Prepare (Plan.Warnings).
func (p *Plan) storageWarning(err error) {
	if !errors.Is(err, storage.ErrWritableStore) {
		fmt.Fprintf(os.Stderr, "cpcache: warning: %v\n", redact.Error(err, p.Config.Storage))
	}
}

// storageHint adds to storage.ErrNoKey how to give the ranks a key.
func storageHint(err error) error {
	if errors.Is(err, storage.ErrNoKey) {
		return fmt.Errorf("%w: a shared Redis needs a MAC key so that whoever can write to it cannot inject pages: "+
			"give every rank the same key file (mode 0600, e.g. from `openssl rand -hex 32`) with --storage-key-file FILE or %s, "+
			"or accept unauthenticated pages with --storage-insecure", storage.ErrNoKey, stores.EnvKeyFile)
	}
	return err
}

// storageError is a rank's error opening the run's storage, as it reports it.
func (p *Plan) storageError(err error) error {
	return fmt.Errorf("runner: --storage: %w", redact.Error(err, p.Config.Storage))
}

// checkStorage opens and closes the storage once, so that a bad URL or an unreachable
// server is reported before any rank starts; what the storage warns of goes to Plan.Warnings.
func (p *Plan) checkStorage() error {
	if c := &p.Config; c.Storage == "" {
		// The settings of a storage are refused without one, not ignored.
		switch {
		case c.StorageClear:
			return bad("--storage-clear needs --storage")
		case c.StorageKeyFile != "":
			return bad("--storage-key-file %s needs --storage", c.StorageKeyFile)
		case c.StorageInsecure:
			return bad("--storage-insecure needs --storage")
		case c.StorageTimeout != 0:
			return bad("--storage-timeout %v needs --storage", c.StorageTimeout)
		case c.PrefetchPolicy != hicache.PrefetchBestEffort:
			return bad("--prefetch-policy %s needs --storage", strings.ReplaceAll(c.PrefetchPolicy.String(), "_", "-"))
		}
		return nil
	}
	st, _, err := p.openStorageRaw(context.Background(), func(err error) {
		p.Warnings = append(p.Warnings, redact.Error(err, p.Config.Storage).Error())
	})
	if err != nil {
		return bad("--storage %s: %v", redact.URL(p.Config.Storage), redact.Error(err, p.Config.Storage))
	}
	if err := st.Close(); err != nil {
		return bad("--storage %s: %v", redact.URL(p.Config.Storage), redact.Error(err, p.Config.Storage))
	}
	return nil
}

// l3Options are the cache's L3 options for the run: its prefetch policy, the cost rule of
// the virtual clock's model (a stored continuation is read only when the model reads it
// faster than it computes it; not with --prefetch-always), defaults for the rest.
func (c *Config) l3Options() hicache.L3Options {
	o := hicache.L3Options{PrefetchPolicy: c.PrefetchPolicy, CallTimeout: c.StorageTimeout}
	if !c.PrefetchAlways {
		o.PrefetchCost = c.Time.Model.PrefetchCost()
	}
	return o
}

// clearStorage removes every page of the run's namespace (job.Open bounds it by
// Config.StorageTimeout).
func clearStorage(ctx context.Context, st storage.Storage, url string) error {
	if err := st.Clear(ctx); err != nil {
		return fmt.Errorf("runner: --storage-clear %s: %w", redact.URL(url), redact.Error(err, url))
	}
	return nil
}
