package storage_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
)

func TestRedisConformance(t *testing.T) {
	r := redistest.Start(t)
	storagetest.Conformance(t, storagetest.Backend{
		Open: func(t *testing.T, opts storage.Options) storage.Storage {
			return openURL(t, r.URL("conformance"), opts)
		},
		Mutate: func(t *testing.T, s storage.Storage, k storage.Key, mutate func([]byte) []byte) {
			name := []byte(storage.RedisKeyName(s, k))
			old, err := storage.RedisCommand(testCtx(t), r.Addr(), []byte("GET"), name)
			if err != nil || old == nil {
				t.Fatalf("mutate: GET %s: %q, %v", name, old, err)
			}
			if _, err := storage.RedisCommand(testCtx(t), r.Addr(), []byte("SET"), name, mutate(old)); err != nil {
				t.Fatalf("mutate: SET %s: %v", name, err)
			}
		},
	})
}

func checkUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, storage.ErrUnavailable) || !strings.HasPrefix(err.Error(), "storage: redis 127.0.0.1:") {
		t.Errorf("%s: err=%v; want ErrUnavailable naming the server", what, err)
	}
}

// allOps runs every operation once with ctx and returns their errors by name.
func allOps(ctx context.Context, s storage.Storage, keys []storage.Key, pages [][]byte) map[string]error {
	errs := map[string]error{}
	errs["put"] = s.Put(ctx, keys, pages)
	_, errs["get"] = s.Get(ctx, keys, pages, make([]bool, len(keys)))
	_, errs["exists"] = s.Exists(ctx, keys, nil)
	errs["delete"] = s.Delete(ctx, keys[:1])
	errs["clear"] = s.Clear(ctx)
	return errs
}

// TestRedisServerLoss kills the server under a live storage: every operation fails with
// ErrUnavailable by its deadline (no hang, no panic); after a restart on the same port the
// same storage works again without being reopened.
func TestRedisServerLoss(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "loss")
	s := openURL(t, r.URL("loss"), storage.Options{Namespace: ns, Timeout: 5 * time.Second})
	defer s.Close()
	keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2)}
	pages := [][]byte{bytes.Repeat([]byte{1}, 64<<10), bytes.Repeat([]byte{2}, 64<<10)}
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	for round := range 2 { // first on pooled connections, then on fresh dials
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for op, err := range allOps(ctx, s, keys, pages) {
			checkUnavailable(t, "server down, round "+strconv.Itoa(round)+": "+op, err)
		}
		cancel()
	}
	if got := s.Stats().Errors; got != 10 {
		t.Errorf("errors counted: %d, want 10", got)
	}
	r.Start() // same port, empty (no persistence)
	dst := [][]byte{make([]byte, 64<<10), make([]byte, 64<<10)}
	if n, err := s.Get(testCtx(t), keys, dst, nil); err != nil || n != 0 {
		t.Fatalf("get after restart: %d hits, %v; want 0 hits and no error", n, err)
	}
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatalf("put after restart: %v", err)
	}
	if n, err := s.Get(testCtx(t), keys, dst, nil); err != nil || n != 2 || !bytes.Equal(dst[1], pages[1]) {
		t.Fatalf("get after restart and put: %d hits, %v", n, err)
	}
}

// TestRedisStalledServer stops the server process (SIGSTOP): connections stay open but
// nothing answers. Calls fail with ErrUnavailable at the context's deadline, or at
// Options.Timeout when the context has none, and work again once the server resumes.
func TestRedisStalledServer(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "stall")
	s := openURL(t, r.URL("stall"), storage.Options{Namespace: ns, Timeout: 300 * time.Millisecond})
	defer s.Close()
	keys := []storage.Key{storage.NewKey(ns, 1)}
	pages := [][]byte{bytes.Repeat([]byte{7}, 64<<10)}
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatal(err)
	}
	r.Signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			r.Signal(syscall.SIGCONT)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := s.Get(ctx, keys, pages, nil)
	cancel()
	checkUnavailable(t, "get from a stopped server (context deadline)", err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("get from a stopped server: %v does not wrap context.DeadlineExceeded", err)
	}
	for op, err := range allOps(context.Background(), s, keys, pages) {
		checkUnavailable(t, "stopped server, default timeout: "+op, err)
	}
	// A cancelled context interrupts a blocked call too.
	ctx, cancelNow := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancelNow() }()
	_, err = s.Exists(ctx, keys, nil)
	checkUnavailable(t, "exists, cancelled while blocked", err)
	r.Signal(syscall.SIGCONT)
	stopped = false
	// The commands that timed out may still run once the server resumes (the delete and
	// clear above do), so write the page again before reading it.
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatalf("put after the server resumed: %v", err)
	}
	dst := [][]byte{make([]byte, 64<<10)}
	if n, err := s.Get(testCtx(t), keys, dst, nil); err != nil || n != 1 || !bytes.Equal(dst[0], pages[0]) {
		t.Fatalf("get after the server resumed: %d hits, %v", n, err)
	}
}

func TestRedisOpenUnreachable(t *testing.T) {
	r := redistest.Start(t)
	r.Kill()
	ns := mustNamespace(t, "unreachable")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := storage.Open(ctx, r.URL("x"), storage.Options{Namespace: ns})
	if !errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), r.Addr()) || !strings.Contains(err.Error(), " open: ") {
		t.Fatalf("open of a dead server: %v; want ErrUnavailable naming %s", err, r.Addr())
	}
}

// TestRedisPrefixes: prefixes separate stores on one server; Clear touches only its own
// prefix and namespace, even when the prefix contains glob characters.
func TestRedisPrefixes(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "prefixes")
	a := openURL(t, r.URL("a*b"), storage.Options{Namespace: ns})
	defer a.Close()
	x := openURL(t, r.URL("axb"), storage.Options{Namespace: ns})
	defer x.Close()
	keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2)}
	pages := [][]byte{{1, 2, 3}, {4, 5, 6}}
	if err := x.Put(testCtx(t), keys, pages); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Exists(testCtx(t), keys, nil); err != nil || n != 0 {
		t.Fatalf("prefix a*b sees prefix axb's pages: %d, %v", n, err)
	}
	if err := a.Put(testCtx(t), keys, pages); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.RedisCommand(testCtx(t), r.Addr(), []byte("SET"), []byte("unrelated"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := a.Clear(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Exists(testCtx(t), keys, nil); n != 0 {
		t.Fatalf("clear left %d pages", n)
	}
	if n, err := x.Exists(testCtx(t), keys, nil); err != nil || n != 2 {
		t.Fatalf("clear of prefix a*b removed pages of prefix axb: %d remain, %v", n, err)
	}
	if v, err := storage.RedisCommand(testCtx(t), r.Addr(), []byte("GET"), []byte("unrelated")); err != nil || string(v) != "v" {
		t.Fatalf("clear removed an unrelated key: %q, %v", v, err)
	}
	if !strings.HasPrefix(storage.RedisKeyName(x, keys[0]), "axb:"+ns.String()+":") {
		t.Errorf("key name %s: want axb:<namespace>:<hash>", storage.RedisKeyName(x, keys[0]))
	}
}

func TestRedisTTL(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "ttl")
	s := openURL(t, r.URL("ttl")+"?ttl=1h&pool=2&timeout=5s", storage.Options{Namespace: ns})
	defer s.Close()
	k := storage.NewKey(ns, 1)
	if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{{1}}); err != nil {
		t.Fatal(err)
	}
	v, err := storage.RedisCommand(testCtx(t), r.Addr(), []byte("PTTL"), []byte(storage.RedisKeyName(s, k)))
	ms, _ := strconv.Atoi(string(v))
	if err != nil || ms <= 0 || ms > 3600_000 {
		t.Fatalf("PTTL of a page written with ttl=1h: %q, %v", v, err)
	}
}

func TestRedisAuth(t *testing.T) {
	r := redistest.Start(t, "--requirepass", "s3cret")
	ns := mustNamespace(t, "auth")
	s := openURL(t, "redis://s3cret@"+r.Addr()+"/auth", storage.Options{Namespace: ns})
	defer s.Close()
	if err := s.Put(testCtx(t), []storage.Key{storage.NewKey(ns, 1)}, [][]byte{{1}}); err != nil {
		t.Fatalf("put with a password: %v", err)
	}
	_, err := storage.Open(testCtx(t), "redis://"+r.Addr()+"/auth", storage.Options{Namespace: ns})
	if err == nil || errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("open without the password: %v; want the server's NOAUTH refusal", err)
	}
	_, err = storage.Open(testCtx(t), "redis://wrong@"+r.Addr()+"/auth", storage.Options{Namespace: ns})
	if err == nil || !strings.Contains(err.Error(), "auth") {
		t.Fatalf("open with a wrong password: %v", err)
	}
}

// TestRedisFull: a server at its memory limit refuses writes with an error reply. Put
// returns an error that names it (not ErrUnavailable: the server is up), the connection
// stays in sync through the pipelined refusals, and reads keep working.
func TestRedisFull(t *testing.T) {
	r := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	ns := mustNamespace(t, "full")
	s := openURL(t, r.URL("full"), storage.Options{Namespace: ns, PoolSize: 1})
	defer s.Close()
	keys := make([]storage.Key, 64)
	pages := make([][]byte, 64)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		pages[i] = bytes.Repeat([]byte{byte(i)}, 64<<10)
	}
	err := s.Put(testCtx(t), keys, pages)
	if err == nil || errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("put of 4 MiB into a 2 MiB server: %v; want the server's OOM refusal", err)
	}
	present := make([]bool, len(keys))
	n, err := s.Exists(testCtx(t), keys, present)
	if err != nil || n == 0 || n == len(keys) {
		t.Fatalf("exists after a partial put: %d leading, %v; want some but not all", n, err)
	}
	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = make([]byte, 64<<10)
	}
	if got, err := s.Get(testCtx(t), keys[:n], dst, nil); err != nil || got != n || !bytes.Equal(dst[n-1], pages[n-1]) {
		t.Fatalf("get of the stored part: %d of %d, %v", got, n, err)
	}
}
