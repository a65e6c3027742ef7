package stores

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cpcache/cpcache/storage"
)

// redisStore is the Redis backend, a go-redis client. Page keys are
// "<prefix>:<namespace hex>:<hash hex>"; values are header + payload (storage/format.go), so a value
// written by something else under the same name, or a truncated one, is a miss. Batches go
// in chunks (chunkKeys keys or chunkBytes bytes per round trip, several at once): one
// pipeline of UNLINK, EXISTS, SET, or GET into a buffer (no allocation per page). The client
// is one server's or a Redis Cluster's (redis_cluster.go): every command names one key,
// so a cluster's pipeline splits by node.
type redisStore struct {
	base
	client    redis.UniversalClient
	keyPrefix string        // "<prefix>:<namespace hex>:"
	conns     chan struct{} // one token per round trip in flight: at most PoolSize connections
}

const (
	chunkKeys = 256
	// chunkBytes: three 64 KiB pages with their headers. Of 256 KiB to 2 MiB, the smallest
	// streamed best (BenchmarkRedisPages: more round trips in flight on the pool).
	chunkBytes = 256 << 10
)

func openRedis(ctx context.Context, cfg *redisConfig) (*redisStore, error) {
	opts := cfg.opts.withDefaults()
	s := &redisStore{
		base:      base{backend: "redis", where: cfg.where(), ns: opts.Namespace.ID(), opts: opts},
		client:    newRedisClient(cfg),
		keyPrefix: cfg.prefix + ":" + opts.Namespace.String() + ":",
		conns:     make(chan struct{}, opts.PoolSize),
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if err := s.call(ctx, func() error { return s.client.Ping(ctx).Err() }); err != nil {
		s.client.Close()
		return nil, s.opErr(ctx, "open", err)
	}
	return s, nil
}

// call runs fn, the I/O of one round trip on one connection, and returns when it does or
// when ctx is done, whichever comes first. go-redis bounds its socket I/O by ctx's deadline
// but does not watch cancellation: a cancelled call returns at once and fn ends in the
// background by the deadline (every call has one: Options.Timeout), still holding its
// connection token. So fn must not touch the caller's buffers; its results are read only
// after call returned nil.
func (s *redisStore) call(ctx context.Context, fn func() error) error {
	select {
	case s.conns <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-s.conns }()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// opErr classifies an error of go-redis: a server error reply has no kind (e.g. OOM: the
// server is full; NOAUTH, WRONGPASS: the credentials are wrong) unless it says the server is
// temporarily unable to serve; everything else means the server could not be used
// (ErrUnavailable), and wraps ctx's error when the deadline passed or ctx was cancelled.
func (s *redisStore) opErr(ctx context.Context, op string, err error) error {
	var reply redis.Error
	switch {
	case errors.As(err, &reply) && transientReply(err.Error()):
		s.lostNode() // CLUSTERDOWN, TRYAGAIN: slots move
		return s.err(op, storage.ErrUnavailable, err)
	case errors.As(err, &reply):
		return s.err(op, nil, err)
	case errors.Is(err, redis.ErrClosed):
		return s.err(op, storage.ErrClosed, nil)
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		// The socket's deadline is ctx's: it can fire before ctx's own timer says so.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%v)", cerr, err)
	}
	s.lostNode()
	return s.err(op, storage.ErrUnavailable, err)
}

// name is the Redis key of k.
func (s *redisStore) name(k storage.Key) string {
	return s.keyPrefix + hex.EncodeToString(k[storage.NamespaceSize:])
}

// names returns the Redis keys of keys, slices of one string (one allocation per batch).
func (s *redisStore) names(keys []storage.Key) []string {
	nameLen := len(s.keyPrefix) + 2*(storage.KeySize-storage.NamespaceSize)
	buf := make([]byte, 0, nameLen*len(keys))
	for _, k := range keys {
		buf = hex.AppendEncode(append(buf, s.keyPrefix...), k[storage.NamespaceSize:])
	}
	all := string(buf)
	out := make([]string, len(keys))
	for i := range out {
		out[i] = all[i*nameLen : (i+1)*nameLen]
	}
	return out
}

// chunks splits keys [0,n) into consecutive ranges of at most chunkKeys keys and
// chunkBytes bytes (size(i) is the bytes of key i; a larger key is a range of its own) and
// calls fn on each, on up to PoolSize connections at once: a batch of pages streams over
// several connections, so verifying and copying one range overlaps the transfer of the
// next. fn returning false says later ranges are not needed (they may run anyway); the
// first error is returned.
func (s *redisStore) chunks(ctx context.Context, n int, size func(i int) int, fn func(lo, hi int) (bool, error)) error {
	var bounds []int // range r is [bounds[r], bounds[r+1])
	for lo := 0; lo < n; {
		bounds = append(bounds, lo)
		hi, bytes := lo, 0
		for hi < n && hi-lo < chunkKeys && (hi == lo || bytes+size(hi) <= chunkBytes) {
			bytes += size(hi)
			hi++
		}
		lo = hi
	}
	bounds = append(bounds, n)
	return forEach(ctx, len(bounds)-1, s.opts.PoolSize, true, func(r int) (bool, error) {
		return fn(bounds[r], bounds[r+1])
	})
}

func noBytes(int) int { return 0 }

func (s *redisStore) Exists(ctx context.Context, keys []storage.Key, present []bool) (int, error) {
	flags, ctx, cancel, err := s.beginLookup(ctx, "exists", keys, nil, present)
	if err != nil {
		return 0, err
	}
	defer cancel()
	err = s.chunks(ctx, len(keys), noBytes, func(lo, hi int) (bool, error) {
		names := s.names(keys[lo:hi])
		cmds := make([]*redis.IntCmd, len(names))
		err := s.call(ctx, func() error {
			pipe := s.client.Pipeline()
			for i, n := range names {
				cmds[i] = pipe.Exists(ctx, n)
			}
			_, err := pipe.Exec(ctx)
			return err
		})
		if err != nil {
			return false, err
		}
		for i, c := range cmds {
			flags[lo+i] = c.Val() > 0
		}
		return present != nil || leading(flags[lo:hi]) == hi-lo, nil
	})
	if err != nil {
		return leading(flags), s.opErr(ctx, "exists", err)
	}
	return leading(flags), nil
}

func (s *redisStore) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	return s.GetBound(ctx, keys, nil, dst, found)
}

func (s *redisStore) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if err := s.checkBinds("get", keys, binds); err != nil {
		return 0, err
	}
	dst = buffers(dst)
	flags, ctx, cancel, err := s.beginLookup(ctx, "get", keys, dst, found)
	if err != nil {
		return 0, err
	}
	defer cancel()
	err = s.chunks(ctx, len(keys), func(i int) int { return storage.StoredLen(len(dst[i])) }, func(lo, hi int) (bool, error) {
		// Each value is read straight from the socket into a buffer of valuePool (GET into
		// a buffer: no allocation per page). The buffers belong to the round trip until it
		// returns: a cancelled one may still be reading into them, so they are recycled
		// only after call returned nil.
		names := s.names(keys[lo:hi])
		bufs := make([]*[]byte, len(names))
		cmds := make([]*redis.ZeroCopyStringCmd, len(names))
		for i := range bufs {
			// Spare bytes let go-redis read the reply's CRLF with the value.
			bufs[i] = pooledValue(storage.StoredLen(len(dst[lo+i])) + crlf)
		}
		err := s.call(ctx, func() error {
			pipe := s.client.Pipeline()
			for i, n := range names {
				cmds[i] = pipe.GetToBuffer(ctx, n, *bufs[i])
			}
			_, err := pipe.Exec(ctx)
			return valueErrorsOnly(err, cmds)
		})
		if err != nil {
			return false, err
		}
		defer releaseValues(bufs)
		for i, c := range cmds {
			s.loadValue(keys[lo+i], bindAt(binds, lo+i), c, dst[lo+i], &flags[lo+i])
		}
		return found != nil || leading(flags[lo:hi]) == hi-lo, nil
	})
	if err != nil {
		return leading(flags), s.opErr(ctx, "get", err)
	}
	return leading(flags), nil
}

// valueErrorsOnly returns nil when the error of a pipeline of GETs into buffers is that of
// some of its values, each kept by its command: a missing key (redis.Nil), a value longer
// than its buffer (go-redis drains it, so the connection stays usable), or a key holding
// another type than a string (WRONGTYPE). Any other error is the round trip's.
func valueErrorsOnly(err error, cmds []*redis.ZeroCopyStringCmd) error {
	if err == nil {
		return nil
	}
	for _, c := range cmds {
		if e := c.Err(); e != nil && !errors.Is(e, redis.Nil) && !tooLong(e) && !wrongType(e) {
			return err
		}
	}
	return nil
}

// tooLong reports whether err is go-redis's refusal of a value longer than its buffer.
func tooLong(err error) bool { return strings.HasPrefix(err.Error(), "redis: buffer too small") }

// wrongType reports whether err is the server's reply to a GET of a key that holds a list,
// a hash or another type than a string: a foreign value under a page's name.
func wrongType(err error) bool {
	if err == nil { // the common case, without the allocation of errors.As
		return false
	}
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// loadValue verifies one GET reply (redis.Nil for a missing key) and copies its payload
// into dst, setting *hit; a missing value counts as a miss, a corrupt one as corrupt. A
// value longer than the buffer (storage.StoredLen + 2), or a key of another type
// (WRONGTYPE), is an error of its command, and corrupt.
func (s *redisStore) loadValue(k storage.Key, bind *storage.Binding, c *redis.ZeroCopyStringCmd, dst []byte, hit *bool) {
	err := c.Err()
	if errors.Is(err, redis.Nil) {
		s.stats.misses.Add(1)
		return
	}
	var reason error
	switch {
	case wrongType(err):
		reason = fmt.Errorf("the key holds another type than a string: %w", err)
	case err != nil:
		reason = fmt.Errorf("stored value is longer than %d bytes (header + page): %w", storage.StoredLen(len(dst)), err)
	default:
		reason = s.decodeValue(c.Bytes(), k, bind, dst)
	}
	if reason != nil {
		s.corrupt(k, fmt.Errorf("redis key %s: %w", s.name(k), reason))
		return
	}
	*hit = true
	s.stats.hits.Add(1)
	s.stats.bytesRead.Add(uint64(len(dst)))
}

func (s *redisStore) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	return s.PutBound(ctx, keys, nil, src)
}

func (s *redisStore) PutBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, src [][]byte) error {
	if err := s.checkBinds("put", keys, binds); err != nil {
		return err
	}
	src = buffers(src)
	ctx, cancel, err := s.beginCall(ctx, "put", keys, src, nil)
	if err != nil {
		return err
	}
	defer cancel()
	ttl := s.opts.TTL
	if ttl > 0 && ttl < time.Millisecond {
		ttl = time.Millisecond // the least PX takes; 0 would mean no expiry
	}
	err = s.chunks(ctx, len(keys), func(i int) int { return storage.StoredLen(len(src[i])) }, func(lo, hi int) (bool, error) {
		// Values are copies (header + payload) that the round trip owns: a cancelled call
		// may still be writing them when Put has returned.
		names := s.names(keys[lo:hi])
		vals := make([]*[]byte, len(names))
		bytes := 0
		for i := range vals {
			vals[i] = pooledValue(storage.StoredLen(len(src[lo+i])))
			s.encodeValue(*vals[i], keys[lo+i], bindAt(binds, lo+i), src[lo+i])
			bytes += len(src[lo+i])
		}
		err := s.call(ctx, func() error {
			defer releaseValues(vals)
			pipe := s.client.Pipeline()
			for i, n := range names {
				pipe.Set(ctx, n, *vals[i], ttl)
			}
			_, err := pipe.Exec(ctx)
			return err
		})
		if err != nil {
			return false, err
		}
		s.stats.puts.Add(uint64(hi - lo))
		s.stats.bytesWritten.Add(uint64(bytes))
		return true, nil
	})
	if err != nil {
		return s.opErr(ctx, "put", err)
	}
	return nil
}

// valuePool recycles the buffers of stored values (*[]byte): Put fills them and the round
// trip that sent them returns them; Get reads into them and returns them once verified.
var valuePool sync.Pool

// crlf is the room a GET buffer needs beyond the value.
const crlf = 2

// pooledValue returns a buffer of valuePool of length n (its contents are not cleared). New
// buffers have room for a CRLF more, so that Put's serve Get's.
func pooledValue(n int) *[]byte {
	v, _ := valuePool.Get().(*[]byte)
	if v == nil || cap(*v) < n {
		b := make([]byte, n, n+crlf)
		v = &b
	}
	*v = (*v)[:n]
	return v
}

func releaseValues(vals []*[]byte) {
	for _, v := range vals {
		valuePool.Put(v)
	}
}

func (s *redisStore) Delete(ctx context.Context, keys []storage.Key) error {
	ctx, cancel, err := s.beginCall(ctx, "delete", keys, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	err = s.chunks(ctx, len(keys), noBytes, func(lo, hi int) (bool, error) {
		names := s.names(keys[lo:hi])
		err := s.call(ctx, func() error { return s.unlink(ctx, s.client, names) })
		if err == nil {
			s.stats.deletes.Add(uint64(hi - lo))
		}
		return true, err
	})
	if err != nil {
		return s.opErr(ctx, "delete", err)
	}
	return nil
}

// unlink deletes names with a pipeline of one-key UNLINKs: a cluster refuses a command
// whose keys hash to different slots (CROSSSLOT), and its pipeline sends each to its node.
func (s *redisStore) unlink(ctx context.Context, c redis.Cmdable, names []string) error {
	pipe := c.Pipeline()
	for _, n := range names {
		pipe.Unlink(ctx, n)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Clear scans every master (the one server, or each master of a cluster: a cluster has no
// SCAN across nodes) for "<prefix>:<namespace hex>:*" and unlinks what it finds. Keys
// written concurrently with Clear may survive it.
func (s *redisStore) Clear(ctx context.Context) error {
	if err := s.begin("clear", nil, nil, nil); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	pattern := globEscape(s.keyPrefix) + "*"
	err := s.forEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			err := s.call(ctx, func() error {
				names, next, err := node.Scan(ctx, cursor, pattern, 1000).Result()
				if err != nil {
					return err
				}
				if len(names) > 0 {
					if err := s.unlink(ctx, node, names); err != nil {
						return err
					}
				}
				cursor = next
				return nil
			})
			if err != nil || cursor == 0 {
				return err
			}
		}
	})
	if err != nil {
		return s.opErr(ctx, "clear", err)
	}
	return nil
}

// transientReply reports whether an error reply means "try again later".
func transientReply(msg string) bool {
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *redisStore) Close() error {
	if s == nil {
		return nil
	}
	if s.closed.Swap(true) {
		return nil
	}
	return s.client.Close()
}
