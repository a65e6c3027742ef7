package gloo

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/parallel"
)

// storeSpec is a parsed store URL.
type storeSpec struct {
	scheme string // "file" or "redis"
	dir    string // file: the directory
	host   string // redis
	port   int    // redis
	prefix string // key prefix of every key this package writes
}

// defaultPrefix is the key prefix when the URL names none.
const defaultPrefix = "cpcache"

// badStoreError is a rendezvous store URL that cannot be used: a bad argument
// (errors.Is parallel.ErrBadArgument), with a message naming the URL.
type badStoreError struct{ msg string }

func (e *badStoreError) Error() string { return e.msg }
func (e *badStoreError) Unwrap() error { return parallel.ErrBadArgument }

func badStore(format string, args ...any) error {
	return &badStoreError{fmt.Sprintf(format, args...)}
}

// parseStore parses file:///dir or redis://host[:port][/prefix]; its errors are
// parallel.ErrBadArgument.
func parseStore(raw string) (storeSpec, error) {
	if raw == "" {
		return storeSpec{}, badStore("gloo: no rendezvous store: set Options.Store or CPCACHE_STORE (file:///dir or redis://host:port)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err // without the URL it quotes
		}
		return storeSpec{}, badStore("gloo: store URL %q: %v", redact.URL(raw), redact.Error(err, raw))
	}
	if u.User != nil {
		return storeSpec{}, badStore("gloo: store URL %q: user or password given, but the rendezvous store has no authentication (keep it on a trusted network)", redact.URL(raw))
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return storeSpec{}, badStore("gloo: store URL %q: file stores take no host (want file:///absolute/dir)", redact.URL(raw))
		}
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return storeSpec{}, badStore("gloo: store URL %q: want file:///absolute/dir", redact.URL(raw))
		}
		return storeSpec{scheme: "file", dir: u.Path, prefix: defaultPrefix}, nil
	case "redis":
		host, portStr := u.Host, "6379"
		if h, p, err := net.SplitHostPort(u.Host); err == nil {
			host, portStr = h, p
		}
		if host == "" {
			return storeSpec{}, badStore("gloo: store URL %q: no redis host", redact.URL(raw))
		}
		port, err := strconv.Atoi(portStr)
		if err != nil || port < 1 || port > 65535 {
			return storeSpec{}, badStore("gloo: store URL %q: bad port %q", redact.URL(raw), portStr)
		}
		prefix := strings.Trim(u.Path, "/")
		if prefix == "" {
			prefix = defaultPrefix
		}
		return storeSpec{scheme: "redis", host: host, port: port, prefix: prefix}, nil
	}
	return storeSpec{}, badStore("gloo: store URL %q: unknown scheme %q (want file or redis)", redact.URL(raw), u.Scheme)
}

func (s storeSpec) open() (*cStore, error) {
	switch s.scheme {
	case "file":
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return nil, fmt.Errorf("gloo: store directory: %w", err)
		}
		st, err := openFileStore(s.dir)
		if err != nil {
			return nil, fmt.Errorf("gloo: file store %s: %w", s.dir, err)
		}
		return st, nil
	case "redis":
		st, err := openRedisStore(s.host, s.port)
		if err != nil {
			return nil, fmt.Errorf("gloo: redis store %s:%d: %w", s.host, s.port, err)
		}
		return st, nil
	}
	return nil, fmt.Errorf("gloo: unknown store scheme %q", s.scheme)
}

// store serialises access to one store handle (Gloo's stores are not thread-safe).
type store struct {
	mu sync.Mutex // protects s
	s  *cStore    // nil once closed
}

func (st *store) set(key string, val []byte, overwrite bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s == nil {
		return errStoreClosed
	}
	return st.s.set(key, val, overwrite)
}

func (st *store) get(key string, timeout time.Duration) ([]byte, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s == nil {
		return nil, errStoreClosed
	}
	return st.s.get(key, timeout)
}

// newCtx runs a context rendezvous under the store lock.
func (st *store) newCtx(prefix string, rank, size int, d *cDevice, timeout time.Duration) (*cCtx, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s == nil {
		return nil, errStoreClosed
	}
	return newCtx(st.s, prefix, rank, size, d, timeout)
}

func (st *store) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.s.close()
	st.s = nil
}

var errStoreClosed = fmt.Errorf("gloo: store closed")

func nonce() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// runPoll is how long a non-zero rank waits for the current run's confirmation before it
// re-reads the run id (it may have read a stale id left by an earlier run).
const runPoll = 300 * time.Millisecond

// agreeRun makes every rank of a fresh run agree on a new run id, so that keys left in the
// store by an earlier run (a reused directory, a long-lived Redis) are never read.
//
// Rank 0 draws a random id N and overwrites key <base>/run with it. Every other rank draws
// its own nonce, reads <base>/run, writes <base>/<N>/ack/<rank> = "<nonce> <size>" and waits
// briefly for <base>/<N>/go. Rank 0 waits for all acks and writes go = every rank's nonce in
// rank order. A rank accepts N only when go lists its own nonce; a stale run id (its go key
// lists another run's nonces, or never appears) makes it re-read <base>/run.
func agreeRun(st *store, base string, rank, size int, deadline time.Time) (string, error) {
	mine := nonce()
	if rank == 0 {
		id := nonce()
		if err := st.set(base+"/run", []byte(id), true); err != nil {
			return "", fmt.Errorf("gloo: publish run id: %w", err)
		}
		nonces := make([]string, size)
		nonces[0] = mine
		for r := 1; r < size; r++ {
			v, err := st.get(fmt.Sprintf("%s/%s/ack/%d", base, id, r), time.Until(deadline))
			if err != nil {
				return "", fmt.Errorf("gloo: waiting for rank %d to join run %s: %w", r, id, err)
			}
			f := strings.Fields(string(v))
			if len(f) != 2 {
				return "", fmt.Errorf("gloo: rank %d joined with malformed ack %q", r, v)
			}
			if f[1] != strconv.Itoa(size) {
				msg := fmt.Sprintf("world size mismatch: rank 0 has %d, rank %d has %s", size, r, f[1])
				_ = st.set(base+"/"+id+"/go", []byte("error "+msg), false)
				return "", fmt.Errorf("gloo: %s", msg)
			}
			nonces[r] = f[0]
		}
		if err := st.set(base+"/"+id+"/go", []byte(strings.Join(nonces, " ")), false); err != nil {
			return "", fmt.Errorf("gloo: publish run %s: %w", id, err)
		}
		return id, nil
	}
	acked := ""
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return "", fmt.Errorf("gloo: rank %d found no current run in the store before the deadline (is rank 0 running with the same store?)", rank)
		}
		v, err := st.get(base+"/run", left)
		if err != nil {
			return "", fmt.Errorf("gloo: waiting for rank 0's run id: %w", err)
		}
		id := string(v)
		if id != acked {
			ack := fmt.Sprintf("%s %d", mine, size)
			if err := st.set(fmt.Sprintf("%s/%s/ack/%d", base, id, rank), []byte(ack), true); err != nil {
				return "", fmt.Errorf("gloo: join run %s: %w", id, err)
			}
			acked = id
		}
		g, err := st.get(base+"/"+id+"/go", min(runPoll, max(time.Until(deadline), time.Millisecond)))
		if err != nil {
			continue // not confirmed yet, or a stale id: re-read
		}
		if msg, ok := bytes.CutPrefix(g, []byte("error ")); ok {
			return "", fmt.Errorf("gloo: rank 0 refused the run: %s", msg)
		}
		f := strings.Fields(string(g))
		if len(f) == size && f[rank] == mine {
			return id, nil
		}
		time.Sleep(20 * time.Millisecond) // a stale run's confirmation; wait for rank 0's id
	}
}
