package stores

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/storage"
)

// Open opens the storage named by rawURL for opts.Namespace:
//
//	file:///abs/dir[?fsync=true&max_bytes=2GiB&ttl=1h]
//	                                         a directory on a local or shared filesystem;
//	                                         max_bytes bounds it (dircap.go), ttl drops
//	                                         pages unused for longer
//	redis://[[user]:pass@]host[:port][/prefix][?ttl=1h&pool_size=8&timeout=5s&db=0]
//	rediss://...[&tls_ca=ca.pem&tls_cert=c.pem&tls_key=k.pem]
//	                                         a Redis server (rediss: over TLS); keys are
//	                                         "<prefix>:<ns>:<hash>" (prefix defaults to
//	                                         "cpcache"); see parseRedisURL for every option
//	redis+cluster://[[user]:pass@]host:port[,host:port...][/prefix][?...]
//	rediss+cluster://...                     a Redis Cluster, reached through the seed
//	                                         nodes named (any of its nodes); the options of
//	                                         a one-server URL except db (redis_cluster.go)
//	mem://name                               process-local memory, shared by every Open of
//	                                         the same name (tests)
//
// Stored values are authenticated with the MAC key that opts name (Options.MACKey: a Redis
// URL without one is refused, ErrNoKey, unless Options.Insecure; a file store makes its
// own). URL query values override the matching Options. The Redis backend checks that the server
// answers before returning (an error wrapping ErrUnavailable if not); later calls reconnect
// by themselves. Opening a file store is bounded the same way, by Options.Timeout or ctx's
// deadline: a file system that does not answer (a dead or frozen mount) fails it with
// ErrUnavailable at the deadline, the open abandoned in the kernel. A URL that cannot be used is an error wrapping ErrBadArgument that quotes
// it, without its password.
func Open(ctx context.Context, rawURL string, opts storage.Options) (storage.Storage, error) {
	st, err := openBackend(ctx, rawURL, options{Options: opts})
	if err != nil {
		return nil, err
	}
	return &purging{st}, nil
}

func openBackend(ctx context.Context, rawURL string, opts options) (backend, error) {
	bad := func(format string, args ...any) error {
		return &storage.OpError{Backend: "url", Where: strconv.Quote(redact.URL(rawURL)), Op: "open", Kind: storage.ErrBadArgument, Err: fmt.Errorf(format, args...)}
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
			case "max_bytes":
				n, err := parseBytes(vals[0])
				if err != nil {
					return nil, bad("max_bytes=%q: %v", vals[0], err)
				}
				opts.MaxBytes = n
			case "ttl":
				d, err := time.ParseDuration(vals[0])
				if err != nil || d <= 0 {
					return nil, bad("ttl=%q is not a positive duration (like 30m or 2h)", vals[0])
				}
				opts.TTL = d
			default:
				return nil, bad("unknown file URL parameter %q (known: fsync, max_bytes, ttl)", name)
			}
		}
		if opts.auth, err = explicitKey(opts); err != nil {
			return nil, err
		}
		return openDirBounded(ctx, u.Path, opts.withDefaults())
	case "redis", "rediss", "redis+cluster", "rediss+cluster":
		parse := parseRedisURL
		if clusterSchemes[u.Scheme] != "" {
			parse = parseRedisClusterURL
		}
		cfg, err := parse(u, opts)
		if err != nil {
			return nil, bad("%v", err)
		}
		if cfg.opts.auth, err = explicitKey(cfg.opts); err != nil {
			return nil, err
		}
		if cfg.opts.auth == nil {
			if !cfg.opts.Insecure {
				return nil, errNoKey(cfg.where())
			}
			cfg.opts.auth = newMAC(nil)
		}
		return openRedis(ctx, cfg)
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
		if isRedisTopologyScheme(u.Scheme) {
			return nil, bad("%v", errRedisTopology)
		}
		return nil, bad("unknown scheme %q (want file, redis, rediss, redis+cluster, rediss+cluster or mem)", u.Scheme)
	}
}
