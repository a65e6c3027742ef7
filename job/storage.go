package job

import (
	"context"
	"fmt"
	"strings"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// agreeStorage compares, across world, the outcome of opening the storage on each rank: st,
// or openErr, or neither without a storage URL. Without it, a rank whose open failed would
// leave its peers with "peer lost" and no cause, and ranks with different MAC keys would each
// open a store whose pages the others reject as forged, and delete. Every rank returns the same
// verdict: nil, a *hicache.StartError naming the lowest rank whose open failed and its cause
// (on that rank wrapping its own error), or an error wrapping ErrMismatch and
// storage.ErrBadArgument naming two ranks that disagree (one without a storage, or another
// MAC key), comparing key fingerprints, never keys.
func agreeStorage(ctx context.Context, world parallel.Group, st storage.Storage, openErr error) error {
	have := "none"
	if st != nil {
		have = "fingerprint " + storage.KeyFingerprint(st)
	}
	all, err := hicache.AgreeStart(ctx, world, "opening the storage", openErr, have)
	if err != nil {
		return err
	}
	describe := func(m string) string {
		fp, ok := strings.CutPrefix(m, "fingerprint ")
		switch {
		case !ok:
			return "no storage"
		case fp == "":
			return "a storage without a MAC key"
		}
		return "a storage with MAC key fingerprint " + fp
	}
	for r, m := range all {
		if m == all[0] {
			continue
		}
		hint := "a storage on some ranks only"
		if strings.HasPrefix(m, "fingerprint ") && strings.HasPrefix(all[0], "fingerprint ") {
			hint = "different storage MAC keys"
		}
		return fmt.Errorf("%w: %w: ranks disagree on the storage (%s): %s on rank %d, %s on rank %d; every rank needs the same storage URL and the same key file (%s)",
			ErrMismatch, storage.ErrBadArgument, hint, describe(all[0]), world.Ranks()[0], describe(m), world.Ranks()[r], stores.EnvKeyFile)
	}
	return nil
}
