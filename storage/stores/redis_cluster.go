package stores

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A Redis Cluster is named by redis+cluster://[[user]:pass@]host:port[,host:port...]/prefix
// (rediss+cluster:// over TLS): the seed nodes, any of the cluster's nodes, masters or
// replicas; go-redis's cluster client learns the slot map from the first that answers,
// sends each key to the master of its slot, splits a pipeline into one pipeline per node,
// follows MOVED and ASK redirections and reloads the slot map when a node fails (a
// replica promoted in its place is found within a call or two).
//
// Keys keep their one-server names, "<prefix>:<ns>:<hash>", without a hash tag: each page
// hashes to its own slot, so a namespace spreads over every master (a tag such as
// "{<prefix>:<ns>}" would put a whole namespace on one node, and the cluster would hold no
// more of it than one server). What that costs: no command may name two keys, so a batch
// is a pipeline of one-key commands (UNLINK per key, as EXISTS, SET and GET already are),
// and Clear scans every master for the namespace's keys (a cluster has no SCAN across
// nodes).

// clusterSchemes are the URL schemes of a Redis Cluster, by their one-server scheme.
var clusterSchemes = map[string]string{"redis+cluster": "redis", "rediss+cluster": "rediss"}

// parseRedisClusterURL reads a redis+cluster:// or rediss+cluster:// URL: every option of a
// one-server URL applies to each node (parseRedisURL reads them), except db (a cluster has
// only database 0).
func parseRedisClusterURL(u *url.URL, opts options) (*redisConfig, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("a redis cluster URL needs seed nodes, like redis+cluster://10.0.0.1:6379,10.0.0.2:6379/prefix")
	}
	var addrs []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, fmt.Errorf("empty node in host list %q", u.Host)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil { // no port: the default
			host, port = h, "6379"
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("node %q: port %q is not a TCP port", h, port)
		}
		if host == "" || strings.ContainsAny(host, "[]") {
			return nil, fmt.Errorf("node %q has no host", h)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	if q := u.Query(); q.Has("db") {
		return nil, fmt.Errorf("db=%q: a Redis Cluster has only database 0", q.Get("db"))
	}
	one := *u
	one.Scheme = clusterSchemes[u.Scheme]
	one.Host = addrs[0]
	cfg, err := parseRedisURL(&one, opts)
	if err != nil {
		return nil, err
	}
	cfg.cluster = clusterOptions(cfg.client, addrs)
	return cfg, nil
}

// clusterOptions are the cluster client's options that give every node's client co.
func clusterOptions(co *redis.Options, addrs []string) *redis.ClusterOptions {
	tlsConfig := co.TLSConfig
	if tlsConfig != nil {
		// Each node's certificate is checked against the address it is dialed at (the
		// slot map's, for nodes the seeds named), not the first seed's.
		tlsConfig = tlsConfig.Clone()
		tlsConfig.ServerName = ""
	}
	return &redis.ClusterOptions{
		Addrs:                   addrs,
		ClientName:              co.ClientName,
		Protocol:                co.Protocol,
		Username:                co.Username,
		Password:                co.Password,
		MaxRetries:              co.MaxRetries,
		MinRetryBackoff:         co.MinRetryBackoff,
		MaxRetryBackoff:         co.MaxRetryBackoff,
		DialTimeout:             co.DialTimeout,
		DialerRetries:           co.DialerRetries,
		DialerRetryTimeout:      co.DialerRetryTimeout,
		ReadTimeout:             co.ReadTimeout,
		WriteTimeout:            co.WriteTimeout,
		ContextTimeoutEnabled:   co.ContextTimeoutEnabled,
		PoolFIFO:                co.PoolFIFO,
		PoolSize:                co.PoolSize,
		MaxConcurrentDials:      co.MaxConcurrentDials,
		PoolTimeout:             co.PoolTimeout,
		MinIdleConns:            co.MinIdleConns,
		MaxIdleConns:            co.MaxIdleConns,
		MaxActiveConns:          co.MaxActiveConns,
		ConnMaxIdleTime:         co.ConnMaxIdleTime,
		ConnMaxLifetime:         co.ConnMaxLifetime,
		ReadBufferSize:          co.ReadBufferSize,
		WriteBufferSize:         co.WriteBufferSize,
		PipelineReadBufferSize:  co.PipelineReadBufferSize,
		PipelineWriteBufferSize: co.PipelineWriteBufferSize,
		PipelinePoolSize:        co.PipelinePoolSize,
		DisableIdentity:         co.DisableIdentity,
		TLSConfig:               tlsConfig,
		// A moved slot is followed a few times (go-redis's default), not forever.
		MaxRedirects:             3,
		MaintNotificationsConfig: co.MaintNotificationsConfig,
	}
}

// newRedisClient is the client of cfg: one server's, or a cluster's.
func newRedisClient(cfg *redisConfig) redis.UniversalClient {
	if cfg.cluster != nil {
		return redis.NewClusterClient(cfg.cluster)
	}
	return redis.NewClient(cfg.client)
}

// forEachMaster calls fn on every master: the one server, or each master of the cluster
// (concurrently; the first error is returned).
func (s *redisStore) forEachMaster(ctx context.Context, fn func(ctx context.Context, c *redis.Client) error) error {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	default:
		return fmt.Errorf("redis client %T", s.client)
	}
}

// lostNode makes a cluster's client reload its slot map (in the background, at most one
// reload at a time) after a call failed for want of a node. go-redis reloads it on MOVED,
// which only a node that answers sends: a client that knew a dead master would keep
// dialing it after its replica took over.
func (s *redisStore) lostNode() {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		c.ReloadState(context.Background())
	}
}
