package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// Opening the L3 storage is a decision of the whole job, as the rest of the start
// (hicache.New agrees its own): every rank opens its handle, then the ranks compare what
// they got. Without it, a rank whose open failed left its peers with "peer lost" and no
// cause, and ranks with different MAC keys each opened a store whose pages the others reject
// as forged, and delete.

// agreeStorage compares, across world, the outcome of opening the storage on each rank:
// st, or openErr, or neither without a storage URL. Every rank returns the same verdict:
// nil, a *hicache.StartError naming the lowest rank whose open failed and its cause (on
// that rank wrapping its own error), or an error wrapping storage.ErrBadArgument naming
// two ranks that disagree (one without storage_url, or another MAC key).
func agreeStorage(ctx context.Context, world parallel.Group, st storage.Storage, openErr error) error {
	have := "none" // no storage_url
	if st != nil {
		have = "fingerprint " + storage.KeyFingerprint(st)
	}
	all, err := hicache.AgreeStart(ctx, world, "opening the storage", openErr, have)
	if err != nil {
		return err
	}
	describe := func(m string) string {
		if fp, ok := strings.CutPrefix(m, "fingerprint "); ok {
			return "a storage with MAC key fingerprint " + fp
		}
		return "no storage (storage_url NULL)"
	}
	for r, m := range all {
		if m != all[0] {
			return fmt.Errorf("%w: ranks disagree on the storage: rank %d has %s, rank %d %s; every rank needs the same storage_url and the same key file (%s)",
				storage.ErrBadArgument, world.Ranks()[0], describe(all[0]), world.Ranks()[r], describe(m), stores.EnvKeyFile)
		}
	}
	return nil
}
