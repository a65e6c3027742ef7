package storage

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisStore is the Redis backend, a go-redis client. Page keys are
// "<prefix>:<namespace hex>:<hash hex>"; values are header + payload (format.go), so a value
// written by something else under the same name, or a truncated one, is a miss. Batches go
// in chunks (chunkKeys keys or chunkBytes bytes per round trip, several at once): one MGET
// or UNLINK, or a pipeline of EXISTS or SET.
type redisStore struct {
	base
	client    *redis.Client
	keyPrefix string        // "<prefix>:<namespace hex>:"
	conns     chan struct{} // one token per round trip in flight: at most PoolSize connections
}

const (
	chunkKeys  = 256
	chunkBytes = 1 << 20
)

func openRedis(ctx context.Context, cfg *redisConfig) (*redisStore, error) {
	opts := cfg.opts.withDefaults()
	s := &redisStore{
		base:      base{backend: "redis", where: cfg.client.Addr, ns: opts.Namespace.ID(), opts: opts},
		client:    redis.NewClient(cfg.client),
		keyPrefix: cfg.prefix + ":" + opts.Namespace.String() + ":",
		conns:     make(chan struct{}, opts.PoolSize),
	}
	ctx, cancel := callContext(ctx, opts.Timeout)
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
// background by the deadline (every call has one, see callContext), still holding its
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
		return s.err(op, ErrUnavailable, err)
	case errors.As(err, &reply):
		return s.err(op, nil, err)
	case errors.Is(err, redis.ErrClosed):
		return s.err(op, ErrClosed, nil)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%v)", cerr, err)
	}
	return s.err(op, ErrUnavailable, err)
}

// name is the Redis key of k.
func (s *redisStore) name(k Key) string {
	return s.keyPrefix + hex.EncodeToString(k[NamespaceSize:])
}

// names returns the Redis keys of keys, slices of one string (one allocation per batch).
func (s *redisStore) names(keys []Key) []string {
	nameLen := len(s.keyPrefix) + 2*(KeySize-NamespaceSize)
	buf := make([]byte, 0, nameLen*len(keys))
	for _, k := range keys {
		buf = hex.AppendEncode(append(buf, s.keyPrefix...), k[NamespaceSize:])
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

func (s *redisStore) Exists(ctx context.Context, keys []Key, present []bool) (int, error) {
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

func (s *redisStore) Get(ctx context.Context, keys []Key, dst [][]byte, found []bool) (int, error) {
	dst = buffers(dst)
	flags, ctx, cancel, err := s.beginLookup(ctx, "get", keys, dst, found)
	if err != nil {
		return 0, err
	}
	defer cancel()
	err = s.chunks(ctx, len(keys), func(i int) int { return storedLen(len(dst[i])) }, func(lo, hi int) (bool, error) {
		names := s.names(keys[lo:hi])
		var vals []any
		err := s.call(ctx, func() error {
			var err error
			vals, err = s.client.MGet(ctx, names...).Result()
			return err
		})
		if err != nil {
			return false, err
		}
		if len(vals) != hi-lo {
			return false, fmt.Errorf("MGET of %d keys returned %d values", hi-lo, len(vals))
		}
		for i, v := range vals {
			s.loadValue(keys[lo+i], v, dst[lo+i], &flags[lo+i])
		}
		return found != nil || leading(flags[lo:hi]) == hi-lo, nil
	})
	if err != nil {
		return leading(flags), s.opErr(ctx, "get", err)
	}
	return leading(flags), nil
}

// loadValue verifies one MGET value (nil for a missing key) and copies its payload into
// dst, setting *hit; a missing value counts as a miss, a corrupt one as corrupt.
func (s *redisStore) loadValue(k Key, v any, dst []byte, hit *bool) {
	val, ok := v.(string)
	if !ok {
		s.stats.misses.Add(1)
		return
	}
	var reason error
	if len(val) != storedLen(len(dst)) {
		reason = errLength(len(val), storedLen(len(dst)))
	} else if reason = s.checkHeader([]byte(val[:HeaderSize]), k, len(dst)); reason == nil {
		copy(dst, val[HeaderSize:])
		reason = s.checkPayload([]byte(val[:HeaderSize]), dst)
	}
	if reason != nil {
		s.corrupt(k, fmt.Errorf("redis key %s: %w", s.name(k), reason))
		return
	}
	*hit = true
	s.stats.hits.Add(1)
	s.stats.bytesRead.Add(uint64(len(dst)))
}

func (s *redisStore) Put(ctx context.Context, keys []Key, src [][]byte) error {
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
	err = s.chunks(ctx, len(keys), func(i int) int { return storedLen(len(src[i])) }, func(lo, hi int) (bool, error) {
		// Values are copies (header + payload) that the round trip owns: a cancelled call
		// may still be writing them when Put has returned.
		names := s.names(keys[lo:hi])
		vals := make([]*[]byte, len(names))
		bytes := 0
		for i := range vals {
			vals[i] = s.encodeValue(keys[lo+i], src[lo+i])
			bytes += len(src[lo+i])
		}
		err := s.call(ctx, func() error {
			defer func() {
				for _, v := range vals {
					valuePool.Put(v)
				}
			}()
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

// valuePool recycles the buffers of stored values (*[]byte), which Put fills and the round
// trip that sent them returns.
var valuePool sync.Pool

// encodeValue returns the stored form of payload under key, header then payload, in a
// buffer of valuePool.
func (s *redisStore) encodeValue(key Key, payload []byte) *[]byte {
	n := storedLen(len(payload))
	v, _ := valuePool.Get().(*[]byte)
	if v == nil || cap(*v) < n {
		b := make([]byte, n)
		v = &b
	}
	*v = (*v)[:n]
	s.encodeHeader((*[HeaderSize]byte)(*v), key, payload)
	copy((*v)[HeaderSize:], payload)
	return v
}

func (s *redisStore) Delete(ctx context.Context, keys []Key) error {
	ctx, cancel, err := s.beginCall(ctx, "delete", keys, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	err = s.chunks(ctx, len(keys), noBytes, func(lo, hi int) (bool, error) {
		names := s.names(keys[lo:hi])
		err := s.call(ctx, func() error { return s.client.Unlink(ctx, names...).Err() })
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

// Clear scans for "<prefix>:<namespace hex>:*" and unlinks what it finds. Keys written
// concurrently with Clear may survive it.
func (s *redisStore) Clear(ctx context.Context) error {
	if err := s.begin("clear", nil, nil, nil); err != nil {
		return err
	}
	ctx, cancel := callContext(ctx, s.opts.Timeout)
	defer cancel()
	pattern := globEscape(s.keyPrefix) + "*"
	var cursor uint64
	for {
		err := s.call(ctx, func() error {
			names, next, err := s.client.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			if len(names) > 0 {
				if err := s.client.Unlink(ctx, names...).Err(); err != nil {
					return err
				}
			}
			cursor = next
			return nil
		})
		if err != nil {
			return s.opErr(ctx, "clear", err)
		}
		if cursor == 0 {
			return nil
		}
	}
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
