package stores

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// redisConfig is what a redis:// or rediss:// URL says, resolved against Options.
type redisConfig struct {
	client  *redis.Options        // the server's, or each cluster node's
	cluster *redis.ClusterOptions // nil: one server
	prefix  string                // key prefix, from the URL path
	opts    options               // with the URL's ttl, timeout and pool applied
}

// where names the store in errors: the server, or the cluster's seed nodes.
func (c *redisConfig) where() string {
	if c.cluster != nil {
		return strings.Join(c.cluster.Addrs, ",")
	}
	return c.client.Addr
}

// errRedisTopology rejects what go-redis could reach but this backend does not do: a
// Sentinel setup, or several hosts in a one-server URL.
var errRedisTopology = errors.New("redis sentinel URLs and several hosts in a redis:// URL are not supported; name one server (the master), redis://host:port/prefix or rediss:// for TLS, or a Redis Cluster's nodes, redis+cluster://host:port,host:port/prefix")

// isRedisTopologyScheme reports schemes other clients use for Sentinel or Cluster URLs
// (a Cluster's own, redis+cluster and rediss+cluster, are read before this is asked).
func isRedisTopologyScheme(scheme string) bool {
	return strings.HasPrefix(scheme, "redis") && (strings.Contains(scheme, "sentinel") || strings.Contains(scheme, "cluster"))
}

// maxRedisPool bounds the connections of a store (pool=, pool_size=, Options.PoolSize)
// and go-redis's other counts of connections.
const maxRedisPool = 1 << 16

// maxRedisBuffer bounds go-redis's buffer sizes (pages larger than a buffer stream through).
const maxRedisBuffer = 64 << 20

// redisParamLimits are the upper bounds of go-redis's integer URL options: over them it
// panics (a count over 2^31-1) or allocates at once what a buffer size says (a terabyte
// kills the process, past any recover).
var redisParamLimits = []struct {
	name string
	max  int
}{
	{"min_idle_conns", maxRedisPool}, {"max_idle_conns", maxRedisPool}, {"max_active_conns", maxRedisPool},
	{"max_concurrent_dials", maxRedisPool}, {"pipeline_pool_size", maxRedisPool},
	{"pipeline_read_buffer_size", maxRedisBuffer}, {"pipeline_write_buffer_size", maxRedisBuffer},
}

// redisDialBreaker is the go-redis pool size: the failed dials after which go-redis stops
// dialing until its once-a-second probe succeeds.
const redisDialBreaker = 1024

// redisOwnParams are the URL parameters this package reads itself; every other one is
// go-redis's (redis.ParseURL: db, dial_timeout, read_timeout, write_timeout, pool_size,
// skip_verify, max_retries, protocol, ...).
var redisOwnParams = []string{"ttl", "timeout", "pool", "tls_ca", "tls_cert", "tls_key"}

// parseRedisURL turns a redis:// or rediss:// URL into client options. The path is the key
// prefix (not go-redis's database number: use ?db=). Userinfo is user:password, :password, or
// a lone password (as redis-cli reads it). Errors never quote the password.
func parseRedisURL(u *url.URL, opts options) (*redisConfig, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("a redis URL needs a host, like redis://127.0.0.1:6379/prefix")
	}
	if strings.Contains(u.Host, ",") {
		return nil, errRedisTopology
	}
	if u.Port() != "" {
		if p, err := strconv.Atoi(u.Port()); err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("port %q is not a TCP port", u.Port())
		}
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix == "" {
		prefix = "cpcache"
	}
	for _, r := range prefix {
		if r <= ' ' || r == 0x7f {
			return nil, fmt.Errorf("key prefix %q has a space or control character", prefix)
		}
	}
	q := u.Query()
	if q.Has("addr") || q.Has("master_name") {
		return nil, errRedisTopology
	}
	own := url.Values{}
	for _, name := range redisOwnParams {
		if q.Has(name) {
			own[name] = q[name]
			q.Del(name)
		}
	}
	if err := applyRedisParams(own, &opts); err != nil {
		return nil, err
	}
	for _, l := range redisParamLimits {
		if n, err := strconv.Atoi(q.Get(l.name)); err == nil && n > l.max {
			return nil, fmt.Errorf("%s=%q is over the limit of %d", l.name, q.Get(l.name), l.max)
		}
	}
	// go-redis reads everything else; it must not see the prefix path or the userinfo
	// (a lone password is a user name to it).
	rest := url.URL{Scheme: u.Scheme, Host: u.Host, RawQuery: q.Encode()}
	co, err := redis.ParseURL(rest.String())
	if err != nil {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "redis: "))
	}
	if co.DB < 0 {
		return nil, fmt.Errorf("db %d is negative", co.DB)
	}
	// go-redis tries a command 1+max_retries times: below -1 (its "no retries") not once,
	// and reports success: a Put that writes nothing, a Get that reads nothing.
	if co.MaxRetries < -1 {
		return nil, fmt.Errorf("max_retries=%q: want -1 (no retries) or more", q.Get("max_retries"))
	}
	// A negative dial timeout fails every dial at once, as if the server were down.
	if co.DialTimeout < 0 {
		return nil, fmt.Errorf("dial_timeout=%q is negative", q.Get("dial_timeout"))
	}
	co.Username, co.Password, err = redisCredentials(u.User)
	if err != nil {
		return nil, err
	}
	if q.Has("pool_size") {
		if co.PoolSize <= 0 {
			return nil, fmt.Errorf("pool_size=%q is not a positive integer", q.Get("pool_size"))
		}
		opts.PoolSize = co.PoolSize
	}
	// The store caps its connections itself (redisStore.conns). go-redis's pool size is
	// also its dial breaker: after that many failed dials it refuses every dial until a
	// background probe, once a second, gets through, so a restarted server would be
	// refused for up to a second while it answers. Sized far above the connections in use,
	// the breaker only trips in a long outage (hicache's own circuit breaker stops calling
	// a dead store long before).
	opts.PoolSize = opts.withDefaults().PoolSize
	if opts.PoolSize > maxRedisPool { // go-redis panics on a pool over 2^31-1
		return nil, fmt.Errorf("pool size %d is over the limit of %d connections", opts.PoolSize, maxRedisPool)
	}
	co.PoolSize = max(redisDialBreaker, opts.PoolSize)
	co.MaxIdleConns = opts.PoolSize
	// Every call has a deadline (its context's or Options.Timeout): go-redis must honour it
	// on the socket; the read and write timeouts then only shorten it.
	co.ContextTimeoutEnabled = true
	// A dead server must fail a call at once, not at its deadline: one dial attempt per
	// connection, and one retry of a failed command (on a fresh connection) unless the URL
	// says otherwise.
	co.DialerRetries = 1
	if !q.Has("max_retries") {
		co.MaxRetries = 1
	}
	co.DisableIdentity = true // no CLIENT SETINFO per connection
	if !q.Has("protocol") {
		// RESP2: cpcache uses no RESP3 feature, and RESP3 connections peek the socket for
		// push notifications before commands (a syscall per round trip).
		co.Protocol = 2
	}
	co.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if err := redisTLS(co, own); err != nil {
		return nil, err
	}
	return &redisConfig{client: co, prefix: prefix, opts: opts}, nil
}

// applyRedisParams sets the Options the URL overrides.
func applyRedisParams(own url.Values, opts *options) error {
	for _, name := range []string{"ttl", "timeout"} {
		if !own.Has(name) {
			continue
		}
		v := own.Get(name)
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%s=%q is not a duration", name, v)
		}
		if name == "ttl" {
			opts.TTL = d
		} else {
			opts.Timeout = d
		}
	}
	if own.Has("pool") {
		v := own.Get("pool")
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("pool=%q is not a positive integer", v)
		}
		opts.PoolSize = n
	}
	return nil
}

// redisCredentials reads the URL's userinfo.
func redisCredentials(ui *url.Userinfo) (user, pass string, err error) {
	if ui == nil {
		return "", "", nil
	}
	user = ui.Username()
	pass, hasPass := ui.Password()
	switch {
	case !hasPass: // redis://secret@host: a password, as in redis-cli
		return "", user, nil
	case pass == "" && user != "":
		return "", "", fmt.Errorf("user %q has an empty password", user)
	}
	return user, pass, nil
}

// redisTLS completes the TLS configuration of a rediss:// URL: tls_ca is a PEM file of the
// authorities to trust instead of the system's, tls_cert and tls_key a client certificate
// (for servers with tls-auth-clients). A redis:// URL may not name TLS files.
func redisTLS(co *redis.Options, own url.Values) error {
	ca, cert, key := own.Get("tls_ca"), own.Get("tls_cert"), own.Get("tls_key")
	if co.TLSConfig == nil {
		if ca != "" || cert != "" || key != "" {
			return fmt.Errorf("tls_ca, tls_cert and tls_key need a rediss:// URL (redis:// is plain TCP)")
		}
		return nil
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return fmt.Errorf("tls_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls_ca %q holds no PEM certificate", ca)
		}
		co.TLSConfig.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return fmt.Errorf("tls_cert and tls_key go together (got only one)")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return fmt.Errorf("tls_cert/tls_key: %w", err)
		}
		co.TLSConfig.Certificates = []tls.Certificate{pair}
	}
	return nil
}
