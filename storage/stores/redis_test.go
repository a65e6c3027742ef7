package stores_test

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
	"github.com/cpcache/cpcache/storage/stores"
)

// TestRedisConformance runs the contract against a plain server, one that requires a
// password (and an ACL user), and one that speaks only TLS with a throwaway CA.
func TestRedisConformance(t *testing.T) {
	t.Run("plain", func(t *testing.T) {
		r := redistest.Start(t)
		redisConformance(t, r, r.URL("conformance"))
	})
	t.Run("requirepass", func(t *testing.T) {
		r := redistest.Start(t, "--requirepass", "s3cret")
		redisConformance(t, r, "redis://:s3cret@"+r.Addr()+"/conformance")
	})
	t.Run("tls", func(t *testing.T) {
		r := redistest.StartTLS(t, redistest.NewTLSFiles(t))
		redisConformance(t, r, r.URL("conformance"))
	})
}

func redisConformance(t *testing.T, r *redistest.Server, url string) {
	raw := r.Client()
	storagetest.Conformance(t, storagetest.Backend{
		Open: func(t *testing.T, opts storage.Options) storage.Storage {
			return openURL(t, url, opts)
		},
		Mutate: func(t *testing.T, s storage.Storage, k storage.Key, mutate func([]byte) []byte) {
			name := stores.RedisKeyName(s, k)
			old, err := raw.Get(testCtx(t), name).Bytes()
			if err != nil {
				t.Fatalf("mutate: GET %s: %v", name, err)
			}
			if err := raw.Set(testCtx(t), name, mutate(old), 0).Err(); err != nil {
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
	_, err := stores.Open(ctx, r.URL("x"), storage.Options{Namespace: ns})
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
	raw := r.Client()
	if err := raw.Set(testCtx(t), "unrelated", "v", 0).Err(); err != nil {
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
	if v, err := raw.Get(testCtx(t), "unrelated").Result(); err != nil || v != "v" {
		t.Fatalf("clear removed an unrelated key: %q, %v", v, err)
	}
	if !strings.HasPrefix(stores.RedisKeyName(x, keys[0]), "axb:"+ns.String()+":") {
		t.Errorf("key name %s: want axb:<namespace>:<hash>", stores.RedisKeyName(x, keys[0]))
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
	ttl, err := r.Client().PTTL(testCtx(t), stores.RedisKeyName(s, k)).Result()
	if err != nil || ttl <= 0 || ttl > time.Hour {
		t.Fatalf("PTTL of a page written with ttl=1h: %v, %v", ttl, err)
	}
}

// TestRedisAuth: a password alone (as redis-cli reads redis://pw@host, or :pw@), an ACL
// user with its password, and refusals that name the server's reply but never the password.
func TestRedisAuth(t *testing.T) {
	r := redistest.Start(t, "--requirepass", "s3cretPW")
	ns := mustNamespace(t, "auth")
	if err := r.Client().Do(testCtx(t), "ACL", "SETUSER", "alice", "on", ">al1cePW", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	for _, userinfo := range []string{"s3cretPW", ":s3cretPW", "default:s3cretPW", "alice:al1cePW"} {
		s := openURL(t, "redis://"+userinfo+"@"+r.Addr()+"/auth", storage.Options{Namespace: ns})
		if err := s.Put(testCtx(t), []storage.Key{storage.NewKey(ns, 1)}, [][]byte{{1}}); err != nil {
			t.Errorf("put as %s: %v", strings.Split(userinfo, ":")[0], err)
		}
		s.Close()
	}
	_, err := stores.Open(testCtx(t), "redis://"+r.Addr()+"/auth", storage.Options{Namespace: ns})
	if err == nil || errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("open without the password: %v; want the server's NOAUTH refusal", err)
	}
	for _, userinfo := range []string{"wrongPW", "alice:wrongPW", "bob:s3cretPW"} {
		_, err = stores.Open(testCtx(t), "redis://"+userinfo+"@"+r.Addr()+"/auth", storage.Options{Namespace: ns})
		if err == nil || errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), "PW") {
			t.Errorf("open as %s: %v; want the server's WRONGPASS refusal without the password", userinfo, err)
		}
	}
}

// TestRedisTLS: a TLS-only server takes rediss:// with the test CA; a client that does not
// trust the CA, has no client certificate, or speaks plain TCP is refused.
func TestRedisTLS(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	r := redistest.StartTLS(t, files)
	ns := mustNamespace(t, "tls")
	s := openURL(t, r.URL("tls")+"&dial_timeout=2s&read_timeout=2s&write_timeout=2s&pool_size=2", storage.Options{Namespace: ns})
	defer s.Close()
	page := bytes.Repeat([]byte{9}, 64<<10)
	keys := []storage.Key{storage.NewKey(ns, 1)}
	if err := s.Put(testCtx(t), keys, [][]byte{page}); err != nil {
		t.Fatal(err)
	}
	dst := [][]byte{make([]byte, len(page))}
	if n, err := s.Get(testCtx(t), keys, dst, nil); err != nil || n != 1 || !bytes.Equal(dst[0], page) {
		t.Fatalf("get over TLS: %d, %v", n, err)
	}
	for what, url := range map[string]string{
		"system roots only":     "rediss://" + r.Addr() + "/tls?tls_cert=" + files.ClientCert + "&tls_key=" + files.ClientKey,
		"no client certificate": "rediss://" + r.Addr() + "/tls?tls_ca=" + files.CA,
		"plain TCP":             "redis://" + r.Addr() + "/tls",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := stores.Open(ctx, url, storage.Options{Namespace: ns})
		cancel()
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("%s: %v; want ErrUnavailable", what, err)
		}
	}
	_, err := stores.Open(testCtx(t), "rediss://"+r.Addr()+"/tls?tls_ca=/no/such/ca.pem", storage.Options{Namespace: ns})
	if !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), "/no/such/ca.pem") {
		t.Errorf("missing CA file: %v", err)
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

// TestRedisForeignType: a key of another type than a string (a list, say) under a page's
// name is a foreign value: Get answers a miss for it and loads the other pages of the batch,
// counts it corrupt and deletes it, so that the next backup (which asks Exists first)
// writes a genuine page. It must not fail the whole Get with WRONGTYPE, every time.
func TestRedisForeignType(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "wrongtype")
	s := openURL(t, r.URL("wrongtype"), storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte{9}, 32)})
	defer s.Close()
	keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2)}
	pages := [][]byte{bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)}
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatal(err)
	}
	raw := r.Client()
	name := stores.RedisKeyName(s, keys[0])
	plant := func() {
		t.Helper()
		if err := raw.Del(testCtx(t), name).Err(); err != nil {
			t.Fatal(err)
		}
		if err := raw.RPush(testCtx(t), name, "not", "a", "page").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, withFound := range []bool{false, true} {
		plant()
		before := s.Stats()
		dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
		var found []bool
		if withFound {
			found = make([]bool, 2)
		}
		n, err := s.Get(testCtx(t), keys, dst, found)
		if err != nil || n != 0 {
			t.Fatalf("get over a list (found %v): %d hits, %v; want a miss and no error", withFound, n, err)
		}
		if withFound && (found[0] || !found[1] || !bytes.Equal(dst[1], pages[1])) {
			t.Errorf("found %v: the genuine page 1 should load beside the foreign one", found)
		}
		st := s.Stats()
		if st.Corrupt != before.Corrupt+1 || st.Purged != before.Purged+1 || st.Errors != before.Errors {
			t.Errorf("corrupt %d→%d, purged %d→%d, errors %d→%d; want one corrupt value purged, no error",
				before.Corrupt, st.Corrupt, before.Purged, st.Purged, before.Errors, st.Errors)
		}
		if n, err := raw.Exists(testCtx(t), name).Result(); err != nil || n != 0 {
			t.Errorf("the foreign list is still there: %d, %v", n, err)
		}
	}
	if err := s.Put(testCtx(t), keys[:1], pages[:1]); err != nil {
		t.Fatal(err)
	}
	dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	if n, err := s.Get(testCtx(t), keys, dst, nil); err != nil || n != 2 || !bytes.Equal(dst[0], pages[0]) {
		t.Fatalf("get after the backup rewrote the page: %d hits, %v", n, err)
	}
}
