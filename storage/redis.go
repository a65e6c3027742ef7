package storage

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// redisStore is the Redis backend. Page keys are "<prefix>:<namespace hex>:<hash hex>";
// values are header + payload (format.go), so a value written by something else under the
// same name, or a truncated one, is a miss. Batches are pipelined in chunks (chunkKeys
// keys or chunkBytes bytes per round trip).
type redisStore struct {
	base
	pool      *respPool
	keyPrefix string // "<prefix>:<namespace hex>:"
}

const (
	chunkKeys  = 256
	chunkBytes = 16 << 20
	keyHexLen  = 2 * (KeySize - NamespaceSize)
)

func openRedis(ctx context.Context, addr, user, pass, prefix string, opts Options) (*redisStore, error) {
	s := &redisStore{
		base:      base{backend: "redis", where: addr, ns: opts.Namespace.ID(), opts: opts},
		pool:      &respPool{addr: addr, user: user, pass: pass, maxIdle: opts.PoolSize},
		keyPrefix: prefix + ":" + opts.Namespace.String() + ":",
	}
	ctx, cancel := callContext(ctx, opts.Timeout)
	defer cancel()
	err := s.pool.do(ctx, func(c *respConn) error {
		c.writeArrayHeader(1)
		c.writeBulkString("PING")
		if err := c.w.Flush(); err != nil {
			return err
		}
		return c.readStatus()
	})
	if err != nil {
		s.pool.close()
		return nil, s.opErr("open", err)
	}
	return s, nil
}

// opErr wraps a pool error: a server error reply has no kind (e.g. OOM: the server is
// full) unless it says the server is temporarily unable to serve; everything else means
// the server could not be used (ErrUnavailable).
func (s *redisStore) opErr(op string, err error) error {
	var re redisError
	switch {
	case errors.As(err, &re) && transientReply(string(re)):
		return s.err(op, ErrUnavailable, err)
	case errors.As(err, &re):
		return s.err(op, nil, err)
	case errors.Is(err, ErrClosed):
		return s.err(op, ErrClosed, nil)
	default:
		return s.err(op, ErrUnavailable, err)
	}
}

func (s *redisStore) writeKey(c *respConn, k Key) {
	c.writeBulkHeader(len(s.keyPrefix) + keyHexLen)
	c.w.WriteString(s.keyPrefix)
	c.num = hex.AppendEncode(c.num[:0], k[NamespaceSize:])
	c.w.Write(c.num)
	c.w.WriteString("\r\n")
}

// chunks calls fn on consecutive [lo,hi) ranges of keys bounded by chunkKeys and chunkBytes
// (size(i) is the bytes of key i) until fn returns false or an error.
func chunks(n int, size func(i int) int, fn func(lo, hi int) (bool, error)) error {
	for lo := 0; lo < n; {
		hi, bytes := lo, 0
		for hi < n && hi-lo < chunkKeys && (hi == lo || bytes+size(hi) <= chunkBytes) {
			bytes += size(hi)
			hi++
		}
		more, err := fn(lo, hi)
		if err != nil || !more {
			return err
		}
		lo = hi
	}
	return nil
}

func (s *redisStore) Exists(ctx context.Context, keys []Key, present []bool) (int, error) {
	flags, ctx, cancel, err := s.beginLookup(ctx, "exists", keys, nil, present)
	if err != nil {
		return 0, err
	}
	defer cancel()
	err = chunks(len(keys), func(int) int { return 0 }, func(lo, hi int) (bool, error) {
		err := s.pool.do(ctx, func(c *respConn) error {
			for i := lo; i < hi; i++ {
				c.writeArrayHeader(2)
				c.writeBulkString("EXISTS")
				s.writeKey(c, keys[i])
			}
			if err := c.w.Flush(); err != nil {
				return err
			}
			var first error
			for i := lo; i < hi; i++ {
				n, err := c.readInt()
				if err != nil {
					var re redisError
					if !errors.As(err, &re) {
						return err
					}
					first = cmp(first, err)
				}
				flags[i] = n > 0
			}
			return first
		})
		if err != nil {
			return false, err
		}
		return present != nil || leading(flags[lo:hi]) == hi-lo, nil
	})
	if err != nil {
		return leading(flags), s.opErr("exists", err)
	}
	return leading(flags), nil
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// getResult is the outcome of one key of a Get round trip, applied to the counters only
// once the round trip succeeded (a retried round trip must not count twice).
type getResult uint8

const (
	getMiss getResult = iota
	getHit
	getCorrupt
)

func (s *redisStore) Get(ctx context.Context, keys []Key, dst [][]byte, found []bool) (int, error) {
	dst = buffers(dst)
	flags, ctx, cancel, err := s.beginLookup(ctx, "get", keys, dst, found)
	if err != nil {
		return 0, err
	}
	defer cancel()
	var results [chunkKeys]getResult
	var corrupt []corruption // corrupt values of the current chunk, reported after success
	err = chunks(len(keys), func(i int) int { return storedLen(len(dst[i])) }, func(lo, hi int) (bool, error) {
		err := s.pool.do(ctx, func(c *respConn) error {
			corrupt = corrupt[:0]
			c.writeArrayHeader(1 + hi - lo)
			c.writeBulkString("MGET")
			for i := lo; i < hi; i++ {
				s.writeKey(c, keys[i])
			}
			if err := c.w.Flush(); err != nil {
				return err
			}
			n, err := c.readLen('*')
			if err != nil {
				return err
			}
			if n != int64(hi-lo) {
				return fmt.Errorf("%w: MGET of %d keys returned %d values", errProtocol, hi-lo, n)
			}
			for i := lo; i < hi; i++ {
				r, reason, err := s.readPage(c, keys[i], dst[i])
				if err != nil {
					return err
				}
				results[i-lo] = r
				if reason != nil {
					corrupt = append(corrupt, corruption{keys[i], reason})
				}
			}
			return nil
		})
		if err != nil {
			return false, err
		}
		for i := lo; i < hi; i++ {
			switch results[i-lo] {
			case getHit:
				flags[i] = true
				s.stats.hits.Add(1)
				s.stats.bytesRead.Add(uint64(len(dst[i])))
			case getMiss:
				s.stats.misses.Add(1)
			}
		}
		for _, c := range corrupt {
			s.corrupt(c.key, c.reason)
		}
		return found != nil || leading(flags[lo:hi]) == hi-lo, nil
	})
	if err != nil {
		return leading(flags), s.opErr("get", err)
	}
	return leading(flags), nil
}

// corruption is a value of a Get chunk that failed verification, and why.
type corruption struct {
	key    Key
	reason error
}

// readPage reads one MGET element into dst. A corrupt value yields getCorrupt and a reason;
// err is only for failures of the connection.
func (s *redisStore) readPage(c *respConn, k Key, dst []byte) (res getResult, reason, err error) {
	n, err := c.readLen('$')
	if err != nil {
		return 0, nil, err
	}
	if n < 0 {
		return getMiss, nil, nil
	}
	if n != int64(storedLen(len(dst))) {
		return s.skipCorrupt(c, k, errLength(int(n), storedLen(len(dst))), n, true)
	}
	hdr := c.hdr[:]
	if _, err := io.ReadFull(c.r, hdr); err != nil {
		return 0, nil, err
	}
	if err := s.checkHeader(hdr, k, len(dst)); err != nil {
		return s.skipCorrupt(c, k, err, n-HeaderSize, true)
	}
	if _, err := io.ReadFull(c.r, dst); err != nil {
		return 0, nil, err
	}
	if err := c.readCRLF(); err != nil {
		return 0, nil, err
	}
	if err := s.checkPayload(hdr, dst); err != nil {
		return s.skipCorrupt(c, k, err, 0, false)
	}
	return getHit, nil, nil
}

// skipCorrupt skips the rest of a corrupt value: rest bytes, then the CRLF unless read.
func (s *redisStore) skipCorrupt(c *respConn, k Key, why error, rest int64, crlf bool) (getResult, error, error) {
	if _, err := c.r.Discard(int(rest)); err != nil {
		return 0, nil, err
	}
	if crlf {
		if err := c.readCRLF(); err != nil {
			return 0, nil, err
		}
	}
	return getCorrupt, fmt.Errorf("redis key %s%x: %w", s.keyPrefix, k[NamespaceSize:], why), nil
}

func (s *redisStore) Put(ctx context.Context, keys []Key, src [][]byte) error {
	src = buffers(src)
	ctx, cancel, err := s.beginCall(ctx, "put", keys, src, nil)
	if err != nil {
		return err
	}
	defer cancel()
	var ttl []byte
	if s.opts.TTL > 0 {
		ttl = strconv.AppendInt(nil, max(1, s.opts.TTL.Milliseconds()), 10)
	}
	err = chunks(len(keys), func(i int) int { return storedLen(len(src[i])) }, func(lo, hi int) (bool, error) {
		err := s.pool.do(ctx, func(c *respConn) error {
			var hdr [HeaderSize]byte
			for i := lo; i < hi; i++ {
				if ttl != nil {
					c.writeArrayHeader(5)
				} else {
					c.writeArrayHeader(3)
				}
				c.writeBulkString("SET")
				s.writeKey(c, keys[i])
				s.encodeHeader(&hdr, keys[i], src[i])
				c.writeBulkHeader(storedLen(len(src[i])))
				c.w.Write(hdr[:])
				c.w.Write(src[i])
				c.w.WriteString("\r\n")
				if ttl != nil {
					c.writeBulkString("PX")
					c.writeBulk(ttl)
				}
			}
			if err := c.w.Flush(); err != nil {
				return err
			}
			var first error
			for i := lo; i < hi; i++ {
				if err := c.readStatus(); err != nil {
					var re redisError
					if !errors.As(err, &re) {
						return err
					}
					first = cmp(first, err)
				}
			}
			return first
		})
		if err != nil {
			return false, err
		}
		bytes := 0
		for _, b := range src[lo:hi] {
			bytes += len(b)
		}
		s.stats.puts.Add(uint64(hi - lo))
		s.stats.bytesWritten.Add(uint64(bytes))
		return true, nil
	})
	if err != nil {
		return s.opErr("put", err)
	}
	return nil
}

func (s *redisStore) Delete(ctx context.Context, keys []Key) error {
	ctx, cancel, err := s.beginCall(ctx, "delete", keys, nil, nil)
	if err != nil {
		return err
	}
	defer cancel()
	err = chunks(len(keys), func(int) int { return 0 }, func(lo, hi int) (bool, error) {
		err := s.pool.do(ctx, func(c *respConn) error {
			c.writeArrayHeader(1 + hi - lo)
			c.writeBulkString("UNLINK")
			for i := lo; i < hi; i++ {
				s.writeKey(c, keys[i])
			}
			if err := c.w.Flush(); err != nil {
				return err
			}
			_, err := c.readInt()
			return err
		})
		if err == nil {
			s.stats.deletes.Add(uint64(hi - lo))
		}
		return true, err
	})
	if err != nil {
		return s.opErr("delete", err)
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
	cursor := "0"
	for {
		var next string
		var names [][]byte
		err := s.pool.do(ctx, func(c *respConn) error {
			c.writeArrayHeader(6)
			c.writeBulkString("SCAN")
			c.writeBulkString(cursor)
			c.writeBulkString("MATCH")
			c.writeBulkString(pattern)
			c.writeBulkString("COUNT")
			c.writeBulkString("1000")
			if err := c.w.Flush(); err != nil {
				return err
			}
			if n, err := c.readLen('*'); err != nil || n != 2 {
				return cmp(err, fmt.Errorf("%w: SCAN reply of %d elements", errProtocol, n))
			}
			cur, err := c.readBulkBytes()
			if err != nil {
				return err
			}
			n, err := c.readLen('*')
			if err != nil {
				return err
			}
			names = names[:0]
			for range n {
				b, err := c.readBulkBytes()
				if err != nil {
					return err
				}
				names = append(names, b)
			}
			next = string(cur)
			if len(names) == 0 {
				return nil
			}
			c.writeArrayHeader(1 + len(names))
			c.writeBulkString("UNLINK")
			for _, b := range names {
				c.writeBulk(b)
			}
			if err := c.w.Flush(); err != nil {
				return err
			}
			_, err = c.readInt()
			return err
		})
		if err != nil {
			return s.opErr("clear", err)
		}
		if next == "0" {
			return nil
		}
		cursor = next
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
	s.pool.close()
	return nil
}
