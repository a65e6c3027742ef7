package stores

import (
	"net/url"
	"testing"

	"github.com/cpcache/cpcache/storage"
)

func TestTransientReply(t *testing.T) {
	for msg, want := range map[string]bool{
		"LOADING Redis is loading the dataset in memory":          true,
		"BUSY Redis is busy running a script":                     true,
		"OOM command not allowed when used memory > 'maxmemory'.": false,
		"ERR unknown command":                                     false,
	} {
		if got := transientReply(msg); got != want {
			t.Errorf("transientReply(%q) = %v, want %v", msg, got, want)
		}
	}
}

// TestParseRedisURL: every option reaches the go-redis options; the path is the key prefix.
func TestParseRedisURL(t *testing.T) {
	ns, _ := storage.NewNamespace("url")
	u, _ := url.Parse("redis://alice:pw@example.com:7000/pfx?db=3&dial_timeout=2s&read_timeout=250ms&write_timeout=3&pool_size=9&ttl=1h&timeout=7s&max_retries=1")
	cfg, err := parseRedisURL(u, options{Options: storage.Options{Namespace: ns}})
	if err != nil {
		t.Fatal(err)
	}
	co := cfg.client
	if co.Addr != "example.com:7000" || co.Username != "alice" || co.Password != "pw" || co.DB != 3 || co.TLSConfig != nil {
		t.Errorf("addr %q user %q db %d tls %v", co.Addr, co.Username, co.DB, co.TLSConfig)
	}
	if co.DialTimeout.String() != "2s" || co.ReadTimeout.String() != "250ms" || co.WriteTimeout.String() != "3s" || co.MaxRetries != 1 {
		t.Errorf("timeouts: dial %v read %v write %v retries %d", co.DialTimeout, co.ReadTimeout, co.WriteTimeout, co.MaxRetries)
	}
	if co.MaxIdleConns != 9 || cfg.opts.PoolSize != 9 || cfg.opts.TTL.String() != "1h0m0s" || cfg.opts.Timeout.String() != "7s" || cfg.prefix != "pfx" {
		t.Errorf("pool %d/%d ttl %v timeout %v prefix %q", co.MaxIdleConns, cfg.opts.PoolSize, cfg.opts.TTL, cfg.opts.Timeout, cfg.prefix)
	}
	if !co.ContextTimeoutEnabled {
		t.Error("go-redis would ignore the call's deadline")
	}
	for raw, want := range map[string][2]string{ // userinfo → user, password
		"redis://h":             {"", ""},
		"redis://secret@h":      {"", "secret"},
		"redis://:secret@h":     {"", "secret"},
		"redis://bob:secret@h/": {"bob", "secret"},
	} {
		u, _ := url.Parse(raw)
		cfg, err := parseRedisURL(u, options{Options: storage.Options{Namespace: ns}})
		if err != nil || cfg.client.Username != want[0] || cfg.client.Password != want[1] || cfg.client.Addr != "h:6379" || cfg.prefix != "cpcache" {
			t.Errorf("%s: %+v, %v", raw, cfg, err)
		}
	}
	u, _ = url.Parse("rediss://h:6380/p?skip_verify=true&pool=3")
	cfg, err = parseRedisURL(u, options{Options: storage.Options{Namespace: ns, PoolSize: 5}})
	if err != nil || cfg.client.TLSConfig == nil || !cfg.client.TLSConfig.InsecureSkipVerify || cfg.client.TLSConfig.ServerName != "h" || cfg.opts.PoolSize != 3 {
		t.Errorf("rediss: %+v, %v", cfg, err)
	}
}

// TestParseRedisClusterURL: the seed nodes (default port 6379), and every option of a
// one-server URL reaches the cluster client; TLS checks each node against its own address.
func TestParseRedisClusterURL(t *testing.T) {
	ns, _ := storage.NewNamespace("url")
	u, _ := url.Parse("rediss+cluster://alice:pw@10.0.0.1:7000,10.0.0.2,node3:7002/pfx?dial_timeout=2s&pool_size=9&ttl=1h&timeout=7s&tls_ca=testdata/none.pem")
	if _, err := parseRedisClusterURL(u, options{Options: storage.Options{Namespace: ns}}); err == nil {
		t.Fatal("a missing tls_ca file was accepted")
	}
	u, _ = url.Parse("rediss+cluster://alice:pw@10.0.0.1:7000,10.0.0.2,node3:7002/pfx?dial_timeout=2s&pool_size=9&ttl=1h&timeout=7s")
	cfg, err := parseRedisClusterURL(u, options{Options: storage.Options{Namespace: ns}})
	if err != nil {
		t.Fatal(err)
	}
	co := cfg.cluster
	if got := cfg.where(); got != "10.0.0.1:7000,10.0.0.2:6379,node3:7002" {
		t.Errorf("nodes %q", got)
	}
	if co.Username != "alice" || co.Password != "pw" || co.DialTimeout.String() != "2s" || !co.ContextTimeoutEnabled || co.MaxRetries != 1 || co.Protocol != 2 {
		t.Errorf("user %q dial %v context timeout %v retries %d protocol %d", co.Username, co.DialTimeout, co.ContextTimeoutEnabled, co.MaxRetries, co.Protocol)
	}
	if co.MaxIdleConns != 9 || cfg.opts.PoolSize != 9 || cfg.opts.TTL.String() != "1h0m0s" || cfg.opts.Timeout.String() != "7s" || cfg.prefix != "pfx" {
		t.Errorf("pool %d/%d ttl %v timeout %v prefix %q", co.MaxIdleConns, cfg.opts.PoolSize, cfg.opts.TTL, cfg.opts.Timeout, cfg.prefix)
	}
	if co.TLSConfig == nil || co.TLSConfig.ServerName != "" || cfg.client.TLSConfig.ServerName != "10.0.0.1" {
		t.Errorf("TLS %+v: want no fixed server name", co.TLSConfig)
	}
}
