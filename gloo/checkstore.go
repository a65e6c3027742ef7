package gloo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// storeCheckTimeout bounds CheckStore's talk with a Redis store when ctx has no deadline.
const storeCheckTimeout = 10 * time.Second

// CheckStore checks a rendezvous store URL before any rank starts, without changing
// anything: the URL parses; a file store's directory exists and is writable, or can be
// created; a Redis store answers PING with PONG (after AUTH with the URL's password, if it
// has one) before ctx's deadline (10 s without one). A server that wants a password the URL
// does not give, or refuses the one it gives, is a bad argument (parallel.ErrBadArgument),
// and so is a bad URL; a server that accepts the connection but does not answer fails with
// parallel.ErrTimeout. Errors never quote a password.
func CheckStore(ctx context.Context, raw string) error {
	spec, err := parseStore(raw)
	if err != nil {
		return err
	}
	switch spec.scheme {
	case "file":
		dir := filepath.Clean(spec.dir)
		for {
			st, err := os.Stat(dir)
			if err == nil {
				if !st.IsDir() {
					return fmt.Errorf("gloo: file store %s: %s is not a directory", spec.dir, dir)
				}
				if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
					return fmt.Errorf("gloo: file store %s: directory %s is not writable: %w", spec.dir, dir, err)
				}
				return nil
			}
			if !os.IsNotExist(err) {
				return fmt.Errorf("gloo: file store %s: %w", spec.dir, err)
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return fmt.Errorf("gloo: file store %s: no existing parent directory", spec.dir)
			}
			dir = parent
		}
	case "redis":
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, storeCheckTimeout)
			defer cancel()
		}
		r := openRedisKV(spec, 0)
		defer r.close()
		return pingRedis(ctx, r, spec)
	}
	return nil
}
