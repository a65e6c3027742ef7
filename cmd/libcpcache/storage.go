package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// Opening the L3 storage is a decision of the whole job, as the rest of the start
// (hicache.New agrees its own): every rank opens its handle, then the ranks compare what
// they got. Without it, a rank whose open failed left its peers with "peer lost" and no
// cause, and ranks with different MAC keys each opened a store whose pages the others reject
// as forged, and delete.

// storageCauseLen bounds the cause a rank whose open failed tells the others.
const storageCauseLen = 1024

// Messages of the agreement: what each rank has.
const (
	storageNone = "none"   // no storage_url
	storageOK   = "ok "    // followed by the key fingerprint
	storageErr  = "error " // followed by the cause
)

// agreeStorage compares, across world, the outcome of opening the storage on each rank:
// st, or openErr, or neither without a storage URL. Every rank returns the same verdict:
// nil, a *hicache.StartError naming the lowest rank whose open failed and its cause (on
// that rank wrapping its own error), or an error wrapping storage.ErrBadArgument naming
// two ranks that disagree (one without storage_url, or another MAC key).
func agreeStorage(ctx context.Context, world parallel.Group, st storage.Storage, openErr error) error {
	msg := storageNone
	switch {
	case openErr != nil:
		msg = storageErr + openErr.Error()
		if len(msg) > storageCauseLen {
			msg = msg[:storageCauseLen]
		}
	case st != nil:
		msg = storageOK + storage.KeyFingerprint(st)
	}
	all, err := world.AllGather(ctx, []byte(msg))
	if err != nil {
		return errors.Join(openErr, fmt.Errorf("cpcache: comparing the storage of every rank: %w", err))
	}
	for r, m := range all {
		if cause, failed := strings.CutPrefix(string(m), storageErr); failed {
			se := &hicache.StartError{Rank: world.Ranks()[r], Group: world.Name(), Cause: "opening the storage: " + cause}
			if r == world.Rank() {
				se.Err = openErr
			}
			return se
		}
	}
	describe := func(m string) string {
		if fp, ok := strings.CutPrefix(m, storageOK); ok {
			return "a storage with MAC key fingerprint " + fp
		}
		return "no storage (storage_url NULL)"
	}
	for r, m := range all {
		if string(m) != string(all[0]) {
			return fmt.Errorf("%w: ranks disagree on the storage: rank %d has %s, rank %d %s; every rank needs the same storage_url and the same key file (%s)",
				storage.ErrBadArgument, world.Ranks()[0], describe(string(all[0])), world.Ranks()[r], describe(string(m)), storage.EnvKeyFile)
		}
	}
	return nil
}
