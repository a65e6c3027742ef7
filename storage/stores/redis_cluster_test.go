package stores_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
	"github.com/cpcache/cpcache/storage/stores"
)

// TestRedisCluster runs the contract against a Redis Cluster (three masters, three
// replicas), checks that a namespace spreads over every master and that Clear empties it on
// each, then kills a master under a live storage: calls fail with ErrUnavailable while its
// slots have no master, and once its replica has taken over the same storage serves every
// page written before, from the replica.
func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t) // skips, saying why, without redis-server or redis-cli
	t.Run("Conformance", func(t *testing.T) { redisClusterConformance(t, c, c.URL("conformance")) })
	t.Run("SpreadAndClear", func(t *testing.T) { testClusterSpreadAndClear(t, c) })
	t.Run("Failover", func(t *testing.T) { testClusterFailover(t, c) })
}

// TestRedisClusterTLSAuth: a cluster whose nodes speak only TLS and need a password takes
// rediss+cluster:// with the CA, a client certificate and the password; without the
// password it is refused with the server's reply, never quoting the password.
func TestRedisClusterTLSAuth(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	c := redistest.StartClusterTLS(t, files, "--requirepass", "s3cretPW", "--masterauth", "s3cretPW")
	url := strings.Replace(c.URL("conformance"), "rediss+cluster://", "rediss+cluster://:s3cretPW@", 1)
	redisClusterConformance(t, c, url)
	ns := mustNamespace(t, "cluster-auth")
	for what, u := range map[string]string{
		"no password":    c.URL("auth"),
		"wrong password": strings.Replace(c.URL("auth"), "rediss+cluster://", "rediss+cluster://:wrongPW@", 1),
	} {
		_, err := stores.Open(testCtx(t), u, storage.Options{Namespace: ns})
		if err == nil || strings.Contains(err.Error(), "PW") || !strings.Contains(err.Error(), "storage: redis 127.0.0.1:") ||
			!(strings.Contains(err.Error(), "NOAUTH") || strings.Contains(err.Error(), "WRONGPASS")) {
			t.Errorf("open with %s: %v; want the server's refusal, naming the nodes and not the password", what, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	plain := strings.Replace(strings.SplitN(url, "?", 2)[0], "rediss+cluster://", "redis+cluster://", 1)
	if _, err := stores.Open(ctx, plain, storage.Options{Namespace: ns}); !errors.Is(err, storage.ErrUnavailable) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("plain TCP to a TLS cluster: %v; want ErrUnavailable without the password", err)
	}
}

func redisClusterConformance(t *testing.T, c *redistest.Cluster, url string) {
	raw := c.Client()
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

// clusterPages writes n pages of 4 KiB under namespace tag and returns their keys and
// contents.
func clusterPages(t *testing.T, s storage.Storage, ns storage.Namespace, n int) ([]storage.Key, [][]byte) {
	t.Helper()
	keys, pages := make([]storage.Key, n), make([][]byte, n)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		pages[i] = bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 2048)
	}
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatalf("put %d pages: %v", n, err)
	}
	return keys, pages
}

// Each page hashes to its own slot (no hash tag): 300 pages land on every master, about a
// third on each; Clear removes the namespace from every master, another one from none.
func testClusterSpreadAndClear(t *testing.T, c *redistest.Cluster) {
	ns, other := mustNamespace(t, "cluster-spread"), mustNamespace(t, "cluster-spread-other")
	s := openURL(t, c.URL("spread"), storage.Options{Namespace: ns})
	defer s.Close()
	o := openURL(t, c.URL("spread"), storage.Options{Namespace: other})
	defer o.Close()
	before := map[string]int{}
	for _, m := range c.Masters() {
		before[m.Addr()], _ = m.DBSize()
	}
	keys, _ := clusterPages(t, s, ns, 300)
	okeys, _ := clusterPages(t, o, other, 30)
	for _, m := range c.Masters() {
		n, err := m.DBSize()
		if got := n - before[m.Addr()]; err != nil || got < 60 {
			t.Errorf("%v holds %d of the 330 new pages (%v); want about a third", m, got, err)
		}
	}
	if err := s.Clear(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	present := make([]bool, len(keys))
	if _, err := s.Exists(testCtx(t), keys, present); err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, p := range present {
		if p {
			left++
		}
	}
	if left != 0 {
		t.Errorf("clear left %d of 300 pages (on the masters it did not scan)", left)
	}
	if n, err := o.Exists(testCtx(t), okeys, nil); err != nil || n != len(okeys) {
		t.Errorf("clear of one namespace removed pages of another: %d of %d remain, %v", n, len(okeys), err)
	}
	// A batch deletes keys of many slots (one UNLINK would be refused: CROSSSLOT).
	if err := o.Delete(testCtx(t), okeys); err != nil {
		t.Fatalf("delete of %d keys over every master: %v", len(okeys), err)
	}
	if n, err := o.Exists(testCtx(t), okeys, make([]bool, len(okeys))); err != nil || n != 0 {
		t.Errorf("after delete: %d remain, %v", n, err)
	}
}

func testClusterFailover(t *testing.T, c *redistest.Cluster) {
	ns := mustNamespace(t, "cluster-failover")
	s := openURL(t, c.URL("failover")+"?timeout=500ms", storage.Options{Namespace: ns})
	defer s.Close()
	const n = 120
	keys, pages := clusterPages(t, s, ns, n)
	c.WaitReplicated(10 * time.Second) // every page is on a replica too
	victim := c.MasterOf(stores.RedisKeyName(s, keys[0]))
	victim.Kill()

	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = make([]byte, len(pages[i]))
	}
	found := make([]bool, n)
	// While the victim's slots have no master, a batch that needs them fails (at once: the
	// dial is refused), by its deadline at the latest, never a hang or a wrong page.
	if _, err := s.Get(testCtx(t), keys, dst, found); err == nil || !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("get with a master down: %v; want ErrUnavailable", err)
	}
	c.WaitOK(20 * time.Second) // the victim's replica took over
	// The storage finds the new master by itself: a call or two may still go to the dead
	// one while its slot map reloads.
	failed := 0
	var hits int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		hits, err = s.Get(testCtx(t), keys, dst, found)
		if err == nil {
			break
		}
		failed++
		if time.Now().After(deadline) {
			t.Fatalf("get 10s after the failover still fails (%d calls): %v", failed, err)
		}
	}
	if hits != n {
		t.Fatalf("after the failover: %d of %d pages hit; want all (they were replicated)", hits, n)
	}
	for i := range pages {
		if !found[i] || !bytes.Equal(dst[i], pages[i]) {
			t.Fatalf("page %d after the failover: found %v, equal %v", i, found[i], bytes.Equal(dst[i], pages[i]))
		}
	}
	if err := s.Put(testCtx(t), keys[:8], pages[:8]); err != nil {
		t.Fatalf("put after the failover: %v", err)
	}
	if st := s.Stats(); st.Corrupt != 0 {
		t.Errorf("%d corrupt values", st.Corrupt)
	}
	t.Logf("failover: %d calls failed after the replica took over, then %d of %d pages hit", failed, hits, n)
}
