package gloo

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// storeDialTimeout bounds CheckStore's connection attempt to a Redis store.
const storeDialTimeout = 2 * time.Second

// CheckStore checks a rendezvous store URL before any rank starts, without changing
// anything: the URL parses; a file store's directory exists and is writable, or can be
// created; a Redis store accepts a TCP connection within ctx (and at most 2 s). Errors
// never quote a password.
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
		ctx, cancel := context.WithTimeout(ctx, storeDialTimeout)
		defer cancel()
		addr := net.JoinHostPort(spec.host, strconv.Itoa(spec.port))
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("gloo: redis store %s unreachable: %w", addr, err)
		}
		return c.Close()
	}
	return nil
}
