package job

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// TestAgreeStorageKey: ranks whose storages have the same MAC key pass; one rank with
// another key makes every rank fail with a mismatch naming both fingerprints (not keys).
func TestAgreeStorageKey(t *testing.T) {
	ns, err := storage.NewNamespace(t.Name())
	require.NoError(t, err)
	key, other := bytes.Repeat([]byte("a"), 32), bytes.Repeat([]byte("b"), 32)
	for _, odd := range []int{-1, 2} {
		members := local.New([]int{0, 1, 2, 3}, local.Options{Kind: "world"})
		errs := make([]error, len(members))
		var wg sync.WaitGroup
		for i, m := range members {
			k := key
			if i == odd {
				k = other
			}
			st, err := stores.Open(context.Background(), "mem://"+t.Name(), storage.Options{Namespace: ns, MACKey: k})
			require.NoError(t, err)
			defer st.Close()
			wg.Go(func() { errs[i] = agreeStorage(context.Background(), m, st, nil) })
		}
		wg.Wait()
		for i, err := range errs {
			if odd < 0 {
				assert.NoError(t, err, "rank %d", i)
				continue
			}
			require.Error(t, err, "rank %d", i)
			assert.True(t, errors.Is(err, ErrMismatch), "rank %d: %v", i, err)
			assert.Contains(t, err.Error(), "different storage MAC keys")
			assert.Contains(t, err.Error(), "on rank 2")
			assert.False(t, strings.Contains(err.Error(), string(key[:8])) || strings.Contains(err.Error(), string(other[:8])), "the key shows: %v", err)
		}
	}
}

// TestAgreeStorageOpenFailure: a rank that could not open the storage makes every rank
// fail: it with its own error, the others naming it and its cause. They must not wait in
// the key comparison for a rank that has left, and learn only that a peer was lost.
func TestAgreeStorageOpenFailure(t *testing.T) {
	ns, err := storage.NewNamespace(t.Name())
	require.NoError(t, err)
	members := local.New([]int{0, 1, 2, 3}, local.Options{Kind: "world"})
	errs := make([]error, len(members))
	openErr := fmt.Errorf("%w: --storage redis://x: no MAC key on this host", ErrBadValue)
	var wg sync.WaitGroup
	for i, m := range members {
		var st storage.Storage
		var own error
		if i == 2 {
			own = openErr
		} else {
			st, err = stores.Open(context.Background(), "mem://"+t.Name(), storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("a"), 32)})
			require.NoError(t, err)
			defer st.Close()
		}
		wg.Go(func() { errs[i] = agreeStorage(context.Background(), m, st, own) })
	}
	wg.Wait()
	for i, err := range errs {
		require.Error(t, err, "rank %d", i)
		if i == 2 {
			assert.ErrorIs(t, err, openErr)
			continue
		}
		assert.ErrorIs(t, err, hicache.ErrPeerFailed)
		assert.Contains(t, err.Error(), "rank 2 of group world[0..3] could not start: opening the storage")
		assert.Contains(t, err.Error(), "no MAC key on this host")
	}
}
