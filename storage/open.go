package storage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cpcache/cpcache/internal/redact"
)

// Open opens the storage named by rawURL for opts.Namespace:
//
//	file:///abs/dir[?fsync=true]             a directory on a local or shared filesystem
//	redis://[user:pass@]host[:port][/prefix][?ttl=1h&pool=8&timeout=5s]
//	                                         a Redis server; keys are "<prefix>:<ns>:<hash>"
//	                                         (prefix defaults to "cpcache")
//	mem://name                               process-local memory, shared by every Open of
//	                                         the same name (tests)
//
// Stored values are authenticated with the MAC key that opts name (Options.MACKey: a Redis
// URL without one is refused, ErrNoKey, unless Options.Insecure; a file store makes its
// own). URL query values override the matching Options. The Redis backend checks that the server
// answers before returning (an error wrapping ErrUnavailable if not); later calls reconnect
// by themselves. A URL that cannot be used is an error wrapping ErrBadArgument that quotes
// it, without its password.
func Open(ctx context.Context, rawURL string, opts Options) (Storage, error) {
	st, err := openBackend(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	return &purging{st}, nil
}

func openBackend(ctx context.Context, rawURL string, opts Options) (backend, error) {
	bad := func(format string, args ...any) error {
		return &OpError{Backend: "url", Where: strconv.Quote(redact.URL(rawURL)), Op: "open", Kind: ErrBadArgument, Err: fmt.Errorf(format, args...)}
	}
	if opts.Namespace.IsZero() {
		return nil, bad("options have no namespace (build one with storage.NewNamespace)")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL, password included
		}
		return nil, bad("%v", err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, bad("query: %v", err)
	}
	switch u.Scheme {
	case "file":
		if u.Opaque != "" {
			return nil, bad("a file URL needs an absolute path, like file:///var/cache/cpcache")
		}
		if u.Host != "" && u.Host != "localhost" {
			return nil, bad("file URL host %q is not supported (use a path on a mounted filesystem)", u.Host)
		}
		if u.Path == "" || u.Path == "/" {
			return nil, bad("a file URL needs a directory, like file:///var/cache/cpcache")
		}
		for name, vals := range q {
			switch name {
			case "fsync":
				b, err := strconv.ParseBool(vals[0])
				if err != nil {
					return nil, bad("fsync=%q is not a boolean", vals[0])
				}
				opts.Fsync = b
			default:
				return nil, bad("unknown file URL parameter %q (known: fsync)", name)
			}
		}
		if opts.auth, err = explicitKey(opts); err != nil {
			return nil, err
		}
		return openDir(u.Path, opts.withDefaults())
	case "redis":
		if u.Host == "" {
			return nil, bad("a redis URL needs a host, like redis://127.0.0.1:6379/prefix")
		}
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "6379")
		} else if p, err := strconv.Atoi(u.Port()); err != nil || p <= 0 || p > 65535 {
			return nil, bad("port %q is not a TCP port", u.Port())
		}
		prefix := strings.Trim(u.Path, "/")
		if prefix == "" {
			prefix = "cpcache"
		}
		for _, r := range prefix {
			if r <= ' ' || r == 0x7f {
				return nil, bad("key prefix %q has a space or control character", prefix)
			}
		}
		for name, vals := range q {
			switch name {
			case "ttl", "timeout":
				d, err := time.ParseDuration(vals[0])
				if err != nil || d < 0 {
					return nil, bad("%s=%q is not a duration", name, vals[0])
				}
				if name == "ttl" {
					opts.TTL = d
				} else {
					opts.Timeout = d
				}
			case "pool":
				n, err := strconv.Atoi(vals[0])
				if err != nil || n <= 0 {
					return nil, bad("pool=%q is not a positive integer", vals[0])
				}
				opts.PoolSize = n
			default:
				return nil, bad("unknown redis URL parameter %q (known: ttl, pool, timeout)", name)
			}
		}
		var user, pass string
		if u.User != nil {
			user = u.User.Username()
			pass, _ = u.User.Password()
			if pass == "" { // redis://secret@host means a password, as in redis-cli
				user, pass = "", user
			}
		}
		if opts.auth, err = explicitKey(opts); err != nil {
			return nil, err
		}
		if opts.auth == nil {
			if !opts.Insecure {
				return nil, errNoKey(addr)
			}
			opts.auth = newAuthenticator(nil)
		}
		return openRedis(ctx, addr, user, pass, prefix, opts.withDefaults())
	case "mem":
		name := u.Host + u.Path
		if name == "" {
			return nil, bad("a mem URL needs a name, like mem://test")
		}
		if len(q) > 0 {
			return nil, bad("mem URLs take no parameters")
		}
		if opts.auth, err = explicitKey(opts); err != nil {
			return nil, err
		}
		return openMem(name, opts.withDefaults()), nil
	case "":
		return nil, bad("no scheme (want file:///dir or redis://host:port/prefix)")
	default:
		return nil, bad("unknown scheme %q (want file, redis or mem)", u.Scheme)
	}
}
