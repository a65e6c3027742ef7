package stores_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// TestFaults: a hanging fault blocks until the context ends, an error fault fails at once,
// both wrap ErrUnavailable and ErrInjected; outside its window or its operations the
// wrapped storage answers.
func TestFaults(t *testing.T) {
	ns := mustNamespace(t, "faults-test")
	base := openURL(t, "mem://faults-test", storage.Options{Namespace: ns})
	defer base.Close()
	keys := []storage.Key{storage.NewKeyBytes(ns, []byte("k"))}
	ctx := context.Background()

	hang := stores.WithFaults(base, stores.Faults{Hang: true, Ops: []string{"exists"}})
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := hang.Exists(short, keys, nil); !errors.Is(err, storage.ErrUnavailable) || !errors.Is(err, stores.ErrInjected) ||
		!errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("hanging exists: %v after %v", err, time.Since(start))
	}
	if _, err := hang.Get(ctx, keys, [][]byte{make([]byte, 8)}, nil); err != nil {
		t.Fatalf("get is not among the faulty operations: %v", err)
	}

	window := stores.WithFaults(base, stores.Faults{After: 50 * time.Millisecond, For: 300 * time.Millisecond})
	for _, step := range []struct {
		want  bool
		sleep time.Duration
	}{{false, 150 * time.Millisecond}, {true, 300 * time.Millisecond}, {false, 0}} {
		err := window.Put(ctx, keys, [][]byte{[]byte("page")})
		if got := errors.Is(err, stores.ErrInjected); got != step.want {
			t.Fatalf("put: %v, want injected %t", err, step.want)
		}
		time.Sleep(step.sleep)
	}
}
