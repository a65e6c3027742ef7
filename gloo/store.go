package gloo

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"runtime/cgo"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/parallel"
)

// storeSpec is a parsed store URL.
type storeSpec struct {
	scheme   string // "file" or "redis"
	dir      string // file: the directory
	host     string // redis
	port     int    // redis
	user     string // redis: ACL user name ("" for AUTH with a password only)
	password string // redis: AUTH password ("" for none)
	prefix   string // key prefix of every key this package writes
	raw      string // the URL, for messages (through redact.URL)
}

func (s storeSpec) addr() string { return net.JoinHostPort(s.host, strconv.Itoa(s.port)) }

// String names the store in messages, without its password.
func (s storeSpec) String() string {
	switch s.scheme {
	case "file":
		return "file store " + s.dir
	case userScheme:
		return "the caller's rendezvous store"
	}
	return "redis store " + s.addr()
}

// userScheme is the scheme of a store the caller gives as a parallel.Store
// (Options.Rendezvous), not as a URL.
const userScheme = "caller"

// userSpec is the spec of the caller's store: its keys under the default prefix.
func userSpec() storeSpec { return storeSpec{scheme: userScheme, prefix: defaultPrefix} }

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

// parseStore parses file:///dir or redis://[[user]:password@]host[:port][/prefix] (a user
// without a password is the password, as redact reads it); its errors are
// parallel.ErrBadArgument.
func parseStore(raw string) (storeSpec, error) {
	if raw == "" {
		return storeSpec{}, badStore("gloo: no rendezvous store: want file:///dir or redis://host:port (--store or CPCACHE_STORE)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err // without the URL it quotes
		}
		return storeSpec{}, badStore("gloo: store URL %q: %v", redact.URL(raw), redact.Error(err, raw))
	}
	switch u.Scheme {
	case "file":
		if u.User != nil {
			return storeSpec{}, badStore("gloo: store URL %q: a file store takes no user or password", redact.URL(raw))
		}
		if u.Host != "" && u.Host != "localhost" {
			return storeSpec{}, badStore("gloo: store URL %q: file stores take no host (want file:///absolute/dir)", redact.URL(raw))
		}
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return storeSpec{}, badStore("gloo: store URL %q: want file:///absolute/dir", redact.URL(raw))
		}
		return storeSpec{scheme: "file", dir: u.Path, prefix: defaultPrefix, raw: raw}, nil
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
		spec := storeSpec{scheme: "redis", host: host, port: port, prefix: prefix, raw: raw}
		if u.User != nil {
			if pw, ok := u.User.Password(); ok {
				spec.user, spec.password = u.User.Username(), pw
			} else {
				spec.password = u.User.Username()
			}
		}
		return spec, nil
	}
	return storeSpec{}, badStore("gloo: store URL %q: unknown scheme %q (want file or redis)", redact.URL(raw), u.Scheme)
}

// keyTTL is how long a Redis key of a run lives after it was written: every key is read
// within the rendezvous that wrote it (at most one timeout after its writer started), so
// twice the timeout and a minute is safe; a timeout so long that this exceeds a week keeps
// keys until the run removes them.
func keyTTL(timeout time.Duration) time.Duration {
	ttl := 2*timeout + time.Minute
	if timeout > 3*24*time.Hour || ttl <= 0 {
		return 0
	}
	return ttl
}

// reapAge is how long a file store keeps keys nobody wrote since: the same bound as
// keyTTL, but at least an hour (other jobs on the store may have longer timeouts).
func reapAge(timeout time.Duration) time.Duration {
	return max(time.Hour, keyTTL(timeout))
}

// openKV opens the store's backend: a file store's directory is made if missing; a Redis
// store is asked for PING (after AUTH with the URL's password) within ctx, so that a
// server that does not talk the protocol or refuses this client fails here.
func (s storeSpec) openKV(ctx context.Context, timeout time.Duration) (kv, error) {
	switch s.scheme {
	case userScheme:
		return nil, fmt.Errorf("gloo: the caller's store is not opened from its spec")
	case "file":
		f, err := openFileKV(s.dir)
		if err != nil {
			return nil, fmt.Errorf("gloo: file store %s: %w", s.dir, err)
		}
		return f, nil
	case "redis":
		r := openRedisKV(s, keyTTL(timeout))
		if err := pingRedis(ctx, r, s); err != nil {
			r.close()
			return nil, err
		}
		return r, nil
	}
	return nil, fmt.Errorf("gloo: unknown store scheme %q", s.scheme)
}

// pingRedis sends PING (the client sends AUTH first when the URL has a password) and
// expects PONG before ctx ends. A refused password or a missing one is a bad argument.
func pingRedis(ctx context.Context, r *redisKV, s storeSpec) error {
	v, err := r.c.Ping(ctx).Result()
	if err == nil && v != "PONG" {
		err = fmt.Errorf("answered PING with %q, not PONG", v)
	}
	if err == nil {
		return nil
	}
	msg := redact.Error(err, s.raw).Error()
	switch {
	case strings.Contains(msg, "NOAUTH"):
		return badStore("gloo: %s refused the rendezvous: it requires a password (%s): give it in the URL, redis://:PASSWORD@host:port", s, msg)
	case strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "invalid password") || strings.Contains(msg, "invalid username-password"):
		return badStore("gloo: %s refused the URL's password (%s)", s, msg)
	case isTimeout(err):
		return fmt.Errorf("gloo: %s accepted the connection but did not answer PING before the deadline (a stopped or hung server, or not Redis?): %w", s, parallel.ErrTimeout)
	}
	return fmt.Errorf("gloo: %s unreachable: %s", s, msg)
}

// isTimeout reports whether err is a deadline that passed (a context's or a socket's).
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, parallel.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// store is one process's handle on a rendezvous store: its backend, the shim's handle on
// it for Gloo, and the keys this process wrote (removed at close, so that a store used by
// many runs does not grow).
type store struct {
	kv     kv
	spec   storeSpec
	ctx    context.Context // cancelled when the rendezvous is abandoned or the store closed
	cancel context.CancelFunc
	handle cgo.Handle
	rdv    sync.Mutex // held through a Gloo rendezvous: the shim's store handle is not thread-safe

	mu       sync.Mutex          // protects everything below
	cs       *cStore             // nil once closed
	deadline time.Time           // bound of Gloo's calls without a timeout (the current newCtx's)
	written  map[string]struct{} // keys this process put or created
}

func newStore(ctx context.Context, spec storeSpec, b kv) (*store, error) {
	st := &store{kv: b, spec: spec, written: map[string]struct{}{}}
	st.ctx, st.cancel = context.WithCancel(ctx)
	st.handle = cgo.NewHandle(st)
	cs, err := newCStore(uintptr(st.handle))
	if err != nil {
		st.handle.Delete()
		st.cancel()
		return nil, err
	}
	st.cs = cs
	return st, nil
}

// opCtx is the context of one store call, bounded by deadline (zero: the store's current
// newCtx deadline).
func (st *store) opCtx(deadline time.Time) (context.Context, context.CancelFunc) {
	if deadline.IsZero() {
		st.mu.Lock()
		deadline = st.deadline
		st.mu.Unlock()
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(parallel.DefaultTimeout)
	}
	return context.WithDeadline(st.ctx, deadline)
}

func (st *store) remember(key string) {
	st.mu.Lock()
	st.written[key] = struct{}{}
	st.mu.Unlock()
}

// put creates or replaces key (Gloo's writes and this package's).
func (st *store) put(key string, val []byte) error {
	ctx, cancel := st.opCtx(time.Time{})
	defer cancel()
	st.remember(key)
	if err := st.kv.put(ctx, key, val); err != nil {
		return st.opError("write "+key, ctx, err)
	}
	return nil
}

// create creates key unless it exists, and reports whether it did.
func (st *store) create(ctx context.Context, key string, val []byte) (bool, error) {
	ok, err := st.kv.create(ctx, key, val)
	if err != nil {
		return false, st.opError("create "+key, ctx, err)
	}
	if ok {
		st.remember(key)
	}
	return ok, nil
}

// wait waits up to timeout (negative: the current newCtx's deadline) for key and returns
// its value.
func (st *store) wait(key string, timeout time.Duration) ([]byte, error) {
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	ctx, cancel := st.opCtx(deadline)
	defer cancel()
	return st.waitCtx(ctx, key)
}

func (st *store) waitCtx(ctx context.Context, key string) ([]byte, error) {
	v, err := pollWait(ctx, st.kv, key)
	if err != nil {
		return nil, st.opError("wait for "+key, ctx, err)
	}
	return v, nil
}

// opError names a failed call and the store; a passed deadline wraps parallel.ErrTimeout.
func (st *store) opError(op string, ctx context.Context, err error) error {
	msg := redact.Error(err, st.spec.raw)
	if isTimeout(err) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("gloo: %s: %s: Timed out: %w", st.spec, op, parallel.ErrTimeout)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("gloo: %s: %s: %w", st.spec, op, context.Canceled)
	}
	return fmt.Errorf("gloo: %s: %s: %v", st.spec, op, msg)
}

// newCtx runs a Gloo context rendezvous (its keys under prefix) through the store; the store
// lock serialises rendezvous of one process (the shim's store handle is not thread-safe).
func (st *store) newCtx(prefix string, rank, size int, d *cDevice, timeout time.Duration) (*cCtx, error) {
	st.rdv.Lock()
	defer st.rdv.Unlock()
	st.mu.Lock()
	cs := st.cs
	st.deadline = time.Now().Add(timeout)
	st.mu.Unlock()
	if cs == nil {
		return nil, errStoreClosed
	}
	return newCtx(cs, prefix, rank, size, d, timeout)
}

// closeWait bounds the removal of this process's keys at close: a store that stopped
// answering must not hold Close.
const closeWait = 2 * time.Second

// close removes the keys this process wrote (best effort, at most closeWait) and closes
// the store. Idempotent.
func (st *store) close() {
	st.cancel() // a rendezvous still running in another goroutine ends now
	st.rdv.Lock()
	defer st.rdv.Unlock()
	st.mu.Lock()
	cs := st.cs
	st.cs = nil
	keys := sortedKeys(st.written)
	st.written = map[string]struct{}{}
	st.mu.Unlock()
	if cs == nil {
		return
	}
	cs.close()
	st.handle.Delete()
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	_ = st.kv.del(ctx, keys...)
	cancel()
	_ = st.kv.close()
}

var errStoreClosed = fmt.Errorf("gloo: store closed")

func nonce() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// ErrStoreInUse is wrapped by the error of a rank whose rendezvous store another job is
// joining through at the same time (same store, same job id or none).
var ErrStoreInUse = errors.New("rendezvous store in use by another job")

// ErrDuplicateRank is matched (errors.Is) by the error of a process given the rank another
// process of the same job (same store, same job id) is joining as. That error matches
// ErrStoreInUse too (the run is taken either way), but its message speaks of the rank, not
// of another job.
var ErrDuplicateRank = errors.New("two processes claim one rank")

// duplicateRankError is the error of a process whose rank of its job another process holds.
type duplicateRankError struct{ msg string }

func (e *duplicateRankError) Error() string { return e.msg }

func (e *duplicateRankError) Is(target error) bool {
	return target == ErrDuplicateRank || target == ErrStoreInUse
}

// runPoll is how long a non-zero rank waits for the current run's confirmation before it
// re-reads the claim (it may have read the claim of a run that is over).
const runPoll = 300 * time.Millisecond

// jobSpace is the key space of a job in the store: "<prefix>/job-<hash of the job id>", or
// "<prefix>/shared" for ranks that learnt no job id.
func jobSpace(prefix, jobID string) string {
	if jobID == "" {
		return prefix + "/shared"
	}
	h := sha256.Sum256([]byte(jobID))
	return prefix + "/job-" + hex.EncodeToString(h[:8])
}

// claimInfo is a parsed claim value: "<run id> <world size> <expiry unix ms> <job id>".
type claimInfo struct {
	run    string
	size   int
	expiry time.Time
	job    string
}

func parseClaim(v []byte) (claimInfo, bool) {
	f := strings.SplitN(string(v), " ", 4)
	if len(f) != 4 {
		return claimInfo{}, false
	}
	size, err1 := strconv.Atoi(f[1])
	ms, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return claimInfo{}, false
	}
	return claimInfo{run: f[0], size: size, expiry: time.UnixMilli(ms), job: f[3]}, true
}

func (c claimInfo) String() string {
	job := c.job
	if job == "" {
		job = "none"
	}
	return fmt.Sprintf("run %s of world size %d (job id %s), joining until %s", c.run, c.size, job, c.expiry.Format(time.RFC3339))
}

// storeName names the store in messages: its URL (password masked) or the caller's store.
func (st *store) storeName() string {
	if st.spec.raw == "" {
		return st.spec.String()
	}
	return redact.URL(st.spec.raw)
}

func (st *store) inUse(format string, args ...any) error {
	return fmt.Errorf("gloo: %s is in use: %s; give each job its own store (or every rank of a job the same job id, CPCACHE_JOB_ID, distinct from other jobs'): %w",
		st.storeName(), fmt.Sprintf(format, args...), ErrStoreInUse)
}

// duplicateRank is the error of a process that found its rank of job jobID taken by another
// process joining the same run.
func (st *store) duplicateRank(rank int, jobID string) error {
	return &duplicateRankError{fmt.Sprintf("gloo: two processes claim rank %d of job %s on %s (every process of a job needs a rank of its own; "+
		"a second job on this store needs a job id of its own)", rank, jobID, st.storeName())}
}

// agreeRun binds this rank to its own job's run and returns the run's id (every key of the
// run lives under <space>/<id>/) and, for rank 0, a function that releases the job's claim
// once the world is connected.
//
// Rank 0 claims <space>/claim with "<id> <size> <expiry> <job id>" until the rendezvous
// deadline; a live claim of another run (a second job joining through the same store, with
// the same job id or none) fails it at once with ErrStoreInUse. Every other rank reads the
// live claim, creates <space>/<id>/ack/<rank> = "<nonce> <size>" (exclusively: a second
// process joining the same run as the same rank is another job's, and fails with
// ErrStoreInUse) and waits briefly for <space>/<id>/go. Rank 0 waits for all acks and writes
// go = every rank's nonce in rank order. A rank accepts the run only when go lists its own
// nonce; the claim of a run that is over (go without it) makes it read the claim again.
func agreeRun(st *store, space, jobID string, rank, size int, deadline time.Time, timeout time.Duration) (string, func(), error) {
	ctx, cancel := context.WithDeadline(st.ctx, deadline)
	defer cancel()
	fail := func(what string, err error) (string, func(), error) {
		return "", nil, fmt.Errorf("gloo: rank %d: %s: %w", rank, what, st.opError("rendezvous", ctx, err))
	}
	mine := nonce()
	claimKey := space + "/claim"
	if rank == 0 {
		id := nonce()
		val := []byte(fmt.Sprintf("%s %d %d %s", id, size, deadline.Add(time.Second).UnixMilli(), jobID))
		taken, held, err := st.kv.claim(ctx, claimKey, val, deadline.Add(time.Second))
		if err != nil {
			return fail("claim the store", err)
		}
		if !taken {
			c, _ := parseClaim(held)
			if jobID != "" && c.job == jobID {
				return "", nil, st.duplicateRank(0, jobID)
			}
			return "", nil, st.inUse("rank 0 of another job (or another process given rank 0) holds it (%s)", c)
		}
		release := func() {
			rctx, rcancel := context.WithTimeout(context.Background(), closeWait)
			defer rcancel()
			_ = st.kv.release(rctx, claimKey, val)
		}
		// Runs that ended long ago (killed before they removed their keys) go now.
		_ = st.kv.reap(ctx, st.spec.prefix, space, reapAge(timeout))
		nonces := make([]string, size)
		nonces[0] = mine
		for r := 1; r < size; r++ {
			ackKey := fmt.Sprintf("%s/%s/ack/%d", space, id, r)
			v, err := st.waitCtx(ctx, ackKey)
			if err != nil {
				release()
				return "", nil, fmt.Errorf("gloo: waiting for rank %d to join run %s: %w", r, id, err)
			}
			f := strings.Fields(string(v))
			if len(f) != 2 {
				release()
				return "", nil, fmt.Errorf("gloo: rank %d joined with malformed ack %q", r, v)
			}
			if f[1] != strconv.Itoa(size) {
				st.remember(ackKey) // the rank that wrote it has given up
				msg := fmt.Sprintf("world size mismatch: rank 0 has %d, rank %d has %s", size, r, f[1])
				_, _ = st.create(ctx, space+"/"+id+"/go", []byte("error "+msg))
				release()
				return "", nil, fmt.Errorf("gloo: %s: %w", msg, parallel.ErrMismatch)
			}
			nonces[r] = f[0]
		}
		if ok, err := st.create(ctx, space+"/"+id+"/go", []byte(strings.Join(nonces, " "))); err != nil || !ok {
			release()
			if err == nil {
				err = fmt.Errorf("go key exists")
			}
			return "", nil, fmt.Errorf("gloo: publish run %s: %w", id, err)
		}
		return id, release, nil
	}
	ack := []byte(fmt.Sprintf("%s %d", mine, size))
	acked := ""
	for {
		if ctx.Err() != nil {
			return "", nil, fmt.Errorf("gloo: rank %d found no current run in %s before the deadline (is rank 0 running with the same store and job id?): %w", rank, st.spec, parallel.ErrTimeout)
		}
		v, ok, err := st.kv.claimed(ctx, claimKey)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return fail("read the claim", err)
		}
		c, valid := parseClaim(v)
		if !ok || !valid {
			sleepCtx(ctx, 10*time.Millisecond) // rank 0 has not claimed the store yet
			continue
		}
		goKey := space + "/" + c.run + "/go"
		if c.run != acked {
			if c.size != size {
				// Rank 0 of this run learns it from the ack and refuses the run; this rank
				// fails at once either way. The ack is not this process's to remove at close
				// (it closes at once, before rank 0 reads it): rank 0 removes it.
				_, _ = st.kv.create(ctx, fmt.Sprintf("%s/%s/ack/%d", space, c.run, rank), ack)
				return "", nil, fmt.Errorf("gloo: world size mismatch: rank 0's %s, rank %d has world size %d: %w", c, rank, size, parallel.ErrMismatch)
			}
			created, err := st.create(ctx, fmt.Sprintf("%s/%s/ack/%d", space, c.run, rank), ack)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				return fail("join run "+c.run, err)
			}
			if !created {
				// Another process joined this run as this rank: the run is over (go is
				// written; read the claim again), or it is another job's.
				if _, done, err := st.kv.get(ctx, goKey); err == nil && done {
					sleepCtx(ctx, 20*time.Millisecond)
					continue
				}
				if jobID != "" && c.job == jobID {
					return "", nil, st.duplicateRank(rank, jobID)
				}
				return "", nil, st.inUse("another process already joined %s as rank %d", c, rank)
			}
			acked = c.run
		}
		wctx, wcancel := context.WithTimeout(ctx, runPoll)
		g, err := pollWait(wctx, st.kv, goKey)
		wcancel()
		if err != nil {
			continue // not confirmed yet, or a run that is over: read the claim again
		}
		if msg, ok := bytes.CutPrefix(g, []byte("error ")); ok {
			return "", nil, fmt.Errorf("gloo: rank 0 refused the run: %s: %w", msg, parallel.ErrMismatch)
		}
		f := strings.Fields(string(g))
		if len(f) == size && f[rank] == mine {
			return c.run, nil, nil
		}
		sleepCtx(ctx, 20*time.Millisecond) // a run that is over; wait for rank 0's claim
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
