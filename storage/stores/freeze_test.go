package stores_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// returnsWithin runs call with a context of deadline d and fails the test unless it returns
// within 30 s (a frozen file system call that the store waits for never returns) with an
// error wrapping ErrUnavailable and context.DeadlineExceeded.
func returnsWithin(t *testing.T, what string, d time.Duration, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- call(ctx) }()
	select {
	case err := <-errc:
		if !errors.Is(err, storage.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s on a frozen file system: %v, want unavailable by the deadline", what, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s on a frozen file system still waiting after 30 s (deadline %v)", what, d)
	}
}

// waitUnstuck waits (at most 30 s) until no abandoned operation of st is still running.
func waitUnstuck(t *testing.T, st storage.Storage) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); st.Stats().Stuck != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations still stuck 30 s after the thaw", st.Stats().Stuck)
		}
	}
}

// TestDirFrozenFileSystem freezes the directory backend's file system operations (they
// block ignoring their context, as the kernel's do on a frozen ext4 or a hung NFS mount):
// every call (Exists, Get, Put, Delete, Clear) returns at its deadline with ErrUnavailable,
// each abandoned operation is counted (Abandoned, Stuck). After the thaw the abandoned
// operations finish without touching the callers' buffers: the page an abandoned Get read
// is neither in its dst nor counted as a hit, and an abandoned Put stored the page as it
// was when called, not the bytes its caller wrote into the buffer afterwards (a slab page
// reused).
func TestDirFrozenFileSystem(t *testing.T) {
	ns := mustNamespace(t, "frozen-test")
	url := "file://" + t.TempDir()
	st := openURL(t, url, storage.Options{Namespace: ns})
	defer st.Close()
	ctx := testCtx(t)
	stored := storage.NewKeyBytes(ns, []byte("stored"))
	page := bytes.Repeat([]byte{0x5a}, 4096)
	if err := st.Put(ctx, []storage.Key{stored}, [][]byte{page}); err != nil {
		t.Fatal(err)
	}

	frozen := stores.WithFaults(st, stores.Faults{Freeze: true}) // until frozen.Close
	const deadline = 50 * time.Millisecond
	keys := []storage.Key{stored}
	returnsWithin(t, "exists", deadline, func(ctx context.Context) error { _, err := frozen.Exists(ctx, keys, nil); return err })
	returnsWithin(t, "exists (present)", deadline, func(ctx context.Context) error {
		_, err := frozen.Exists(ctx, keys, make([]bool, 1))
		return err
	})
	dst := bytes.Repeat([]byte{0xee}, len(page))
	found := []bool{false}
	returnsWithin(t, "get", deadline, func(ctx context.Context) error {
		n, err := frozen.Get(ctx, keys, [][]byte{dst}, found)
		if n != 0 || found[0] {
			t.Errorf("abandoned get found %d pages (%v)", n, found)
		}
		return err
	})
	fresh := storage.NewKeyBytes(ns, []byte("fresh"))
	src := bytes.Repeat([]byte{0x11}, len(page))
	returnsWithin(t, "put", deadline, func(ctx context.Context) error { return frozen.Put(ctx, []storage.Key{fresh}, [][]byte{src}) })
	copy(src, bytes.Repeat([]byte{0x22}, len(src))) // the caller reuses its buffer
	returnsWithin(t, "delete", deadline, func(ctx context.Context) error {
		return frozen.Delete(ctx, []storage.Key{storage.NewKeyBytes(ns, []byte("other"))})
	})
	if s := frozen.Stats(); s.Abandoned != 5 || s.Stuck != 5 {
		t.Fatalf("stats %+v: want 5 operations abandoned and stuck", s)
	}

	frozen.Close() // thaw (and close st): the abandoned operations run now
	waitUnstuck(t, st)
	if s := st.Stats(); s.Abandoned != 5 || s.Hits != 0 {
		t.Fatalf("stats %+v after the thaw: want 5 abandoned, no hit delivered", s)
	}
	if !bytes.Equal(dst, bytes.Repeat([]byte{0xee}, len(dst))) {
		t.Fatal("an abandoned get wrote into its caller's buffer after it returned")
	}
	st = openURL(t, url, storage.Options{Namespace: ns})
	defer st.Close()
	got := make([]byte, len(page))
	if n, err := st.Get(ctx, []storage.Key{fresh}, [][]byte{got}, nil); n != 1 || err != nil {
		t.Fatalf("the abandoned put did not store its page after the thaw: %d, %v", n, err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x11}, len(got))) {
		t.Fatalf("an abandoned put stored %#x..., not the page it was given", got[:4])
	}

	frozen = stores.WithFaults(st, stores.Faults{Freeze: true})
	returnsWithin(t, "clear", deadline, frozen.Clear)
	if s := frozen.Stats(); s.Abandoned != 1 || s.Stuck != 1 {
		t.Fatalf("stats %+v: want the clear abandoned and stuck", s)
	}
	frozen.Close()
	waitUnstuck(t, st)
}

// TestDirFrozenFileSystemBound: with Options.MaxStuck abandoned operations still stuck,
// further calls fail at once with ErrStuck (and ErrUnavailable), long before their own
// deadline, instead of starting goroutines that pile up; after the thaw calls work again.
func TestDirFrozenFileSystemBound(t *testing.T) {
	ns := mustNamespace(t, "frozen-bound-test")
	url := "file://" + t.TempDir()
	st := openURL(t, url, storage.Options{Namespace: ns, MaxStuck: 2})
	defer st.Close()
	frozen := stores.WithFaults(st, stores.Faults{Freeze: true, Ops: []string{"exists"}})
	keys := []storage.Key{storage.NewKeyBytes(ns, []byte("k"))}
	for range 2 {
		returnsWithin(t, "exists", 20*time.Millisecond, func(ctx context.Context) error { _, err := frozen.Exists(ctx, keys, nil); return err })
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	within(t, 30*time.Second, "a call past MaxStuck", func() {
		_, err := frozen.Exists(ctx, keys, nil)
		if !errors.Is(err, storage.ErrStuck) || !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("exists with 2 operations stuck (MaxStuck 2): %v, want ErrStuck", err)
		}
	})
	// Put is not frozen, but the file system is as good as down: refused too.
	if err := frozen.Put(ctx, keys, [][]byte{[]byte("page")}); !errors.Is(err, storage.ErrStuck) {
		t.Fatalf("put with 2 operations stuck: %v, want ErrStuck", err)
	}
	if s := st.Stats(); s.Abandoned != 2 || s.Stuck != 2 {
		t.Fatalf("stats %+v: want 2 abandoned and stuck", s)
	}
	frozen.Close() // thaw (and close st)
	waitUnstuck(t, st)
	st = openURL(t, url, storage.Options{Namespace: ns, MaxStuck: 2})
	defer st.Close()
	if err := st.Put(ctx, keys, [][]byte{[]byte("page")}); err != nil {
		t.Fatalf("put after the thaw: %v", err)
	}
	if n, err := st.Exists(ctx, keys, nil); n != 1 || err != nil {
		t.Fatalf("exists after the thaw: %d, %v", n, err)
	}
}

// TestDirOpenFrozen: opening a file:// store on a file system that does not answer (a dead
// mount at start: the MkdirAll, the key file, the root's descriptor) returns at the open's
// deadline, its context's or Options.Timeout, with ErrUnavailable; the abandoned open,
// once the kernel answers, leaves nothing open, and the store then opens.
func TestDirOpenFrozen(t *testing.T) {
	ns, err := storage.NewNamespace("open-frozen")
	if err != nil {
		t.Fatal(err)
	}
	url := "file://" + t.TempDir()
	thaw := stores.FreezeOpen()
	defer thaw()
	start := time.Now()
	returnsWithin(t, "Open (context deadline)", 200*time.Millisecond, func(ctx context.Context) error {
		st, err := stores.Open(ctx, url, storage.Options{Namespace: ns})
		if st != nil {
			st.Close()
		}
		return err
	})
	returnsWithin(t, "Open (Options.Timeout)", time.Minute, func(ctx context.Context) error {
		st, err := stores.Open(ctx, url, storage.Options{Namespace: ns, Timeout: 200 * time.Millisecond})
		if st != nil {
			st.Close()
		}
		return err
	})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("two opens bounded at 200 ms took %v", d)
	}
	thaw()
	st, err := stores.Open(context.Background(), url, storage.Options{Namespace: ns, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Open after the thaw: %v", err)
	}
	defer st.Close()
	k := storage.NewKey(ns, 1)
	if err := st.Put(context.Background(), []storage.Key{k}, [][]byte{bytes.Repeat([]byte{7}, 64)}); err != nil {
		t.Fatalf("Put after the thaw: %v", err)
	}
}
