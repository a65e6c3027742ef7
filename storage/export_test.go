package storage

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
)

// Test hooks into the backends' internals.

// DirPath returns the file that holds k in a directory storage.
func DirPath(s Storage, k Key) string {
	_, name := s.(*purging).backend.(*dirStore).path(k)
	return name
}

// RedisKeyName returns the Redis key that holds k.
func RedisKeyName(s Storage, k Key) string {
	rs := s.(*purging).backend.(*redisStore)
	return rs.keyPrefix + hex.EncodeToString(k[NamespaceSize:])
}

// MutateMem replaces the stored bytes of k in mem table name with mutate(old).
func MutateMem(name string, k Key, mutate func([]byte) []byte) bool {
	memTablesMu.Lock()
	t := memTables[name]
	memTablesMu.Unlock()
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.vals[k]
	if ok {
		t.vals[k] = mutate(append([]byte(nil), v...))
	}
	return ok
}

// RedisCommand runs one command on a fresh connection to addr and returns a bulk or
// integer reply as bytes (nil for a null bulk, a status reply as its text).
func RedisCommand(ctx context.Context, addr string, args ...[]byte) ([]byte, error) {
	c, err := dialResp(ctx, addr, "", "")
	if err != nil {
		return nil, err
	}
	defer c.close()
	if dl, ok := ctx.Deadline(); ok {
		c.nc.SetDeadline(dl)
	}
	c.writeArrayHeader(len(args))
	for _, a := range args {
		c.writeBulk(a)
	}
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	switch line[0] {
	case '$':
		n, err := parseInt(line[1 : len(line)-2])
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return nil, err
		}
		return b[:n], nil
	case '+', ':':
		return append([]byte(nil), line[1:len(line)-2]...), nil
	default:
		return nil, errors.New(string(line))
	}
}
