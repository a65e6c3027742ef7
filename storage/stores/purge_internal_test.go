package stores

import (
	"context"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
)

// deleteSpy is a mem backend that records the context of each Delete (the purge's).
type deleteSpy struct {
	*memStore
	deadlines []time.Time // zero: no deadline
	live      []bool      // the context was not done
}

func (s *deleteSpy) Delete(ctx context.Context, keys []storage.Key) error {
	dl, _ := ctx.Deadline()
	s.deadlines = append(s.deadlines, dl)
	s.live = append(s.live, ctx.Err() == nil)
	return s.memStore.Delete(ctx, keys)
}

// TestPurgeKeepsTheCallsDeadline: the deletion of the values a Get rejected is part of the
// call, bounded by its context (README: every call is bounded by Options.Timeout or by its
// context's deadline, whichever comes first; a cancelled call returns at once). It must not
// run without the context's deadline and cancellation, for up to Options.Timeout more: a
// stalled store would hold a Get, and a cache's drain of its storage jobs, that long.
func TestPurgeKeepsTheCallsDeadline(t *testing.T) {
	ns, _ := storage.NewNamespace("purge-deadline")
	opts := options{Options: storage.Options{Namespace: ns, Timeout: time.Hour}}.withDefaults()
	spy := &deleteSpy{memStore: openMem(t.Name(), opts)}
	st := &purging{spy}
	keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2)}
	page := make([]byte, 64)
	corrupt := func(k storage.Key) {
		t.Helper()
		if err := st.Put(context.Background(), []storage.Key{k}, [][]byte{page}); err != nil {
			t.Fatal(err)
		}
		if !MutateMem(t.Name(), k, func(v []byte) []byte { v[len(v)-1] ^= 1; return v }) {
			t.Fatal("no value to corrupt")
		}
	}

	corrupt(keys[0])
	deadline := time.Now().Add(time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	if n, err := st.Get(ctx, keys[:1], [][]byte{make([]byte, 64)}, nil); n != 0 || err != nil {
		t.Fatalf("get of a corrupt value: %d, %v", n, err)
	}
	cancel()
	if len(spy.deadlines) != 1 || spy.deadlines[0].IsZero() || spy.deadlines[0].After(deadline) {
		t.Fatalf("purge deletes with deadlines %v; want one no later than the call's, %v", spy.deadlines, deadline)
	}

	// A call cancelled meanwhile deletes nothing more; its rejected keys wait for the next.
	corrupt(keys[1])
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	st.Get(ctx, keys[1:], [][]byte{make([]byte, 64)}, nil) // mem ignores the context
	for i, live := range spy.live[1:] {
		if live {
			t.Fatalf("delete %d of the purge ran with a live context after the call was cancelled", i+1)
		}
	}
	if _, err := st.Exists(context.Background(), keys, nil); err != nil {
		t.Fatal(err)
	}
	if got := st.Stats().Purged; got != 2 {
		t.Fatalf("%d values purged, want 2 (the cancelled call's by the next call)", got)
	}
}
