package stores_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

func TestOpenBadURLs(t *testing.T) {
	ns := mustNamespace(t, "urls")
	for _, c := range []struct{ url, want string }{
		{"", "no scheme"},
		{"/var/cache", "no scheme"},
		{"s3://bucket/x", `unknown scheme "s3"`},
		{"file:relative/dir", "absolute path"},
		{"file://", "needs a directory"},
		{"file:///", "needs a directory"},
		{"file://otherhost/dir", `host "otherhost"`},
		{"file:///tmp/x?fsync=maybe", `fsync="maybe"`},
		{"file:///tmp/x?color=red", `unknown file URL parameter "color"`},
		{"redis:///prefix", "needs a host"},
		{"redis://127.0.0.1:0/p", `port "0"`},
		{"redis://127.0.0.1:99999/p", `port "99999"`},
		{"redis://127.0.0.1:6379/p?ttl=soon", `ttl="soon"`},
		{"redis://127.0.0.1:6379/p?pool=0", `pool="0"`},
		{"redis://127.0.0.1:6379/p?color=red", "unexpected option: color"},
		{"redis://127.0.0.1:6379/p?db=x", "invalid database number"},
		{"redis://127.0.0.1:6379/p?db=-1", "db -1 is negative"},
		{"redis://127.0.0.1:6379/p?dial_timeout=soon", "invalid dial_timeout duration"},
		{"redis://127.0.0.1:6379/p?pool_size=-2", `pool_size="-2"`},
		// go-redis panicked on a pool over 2^31-1, ran no command with max_retries below -1
		// (a Put reported stored what it never sent), and failed every dial with a
		// negative dial timeout.
		{"redis://127.0.0.1:6379/p?pool=1000000000000", "pool size 1000000000000 is over the limit"},
		{"redis://127.0.0.1:6379/p?pool_size=4294967296", "pool size 4294967296 is over the limit"},
		{"redis://127.0.0.1:6379/p?max_retries=-5", `max_retries="-5"`},
		// Counts over 2^31-1 panicked inside go-redis, and a buffer of a terabyte was
		// allocated at once (a fatal out of memory, past any recover).
		{"redis://127.0.0.1:6379/p?min_idle_conns=1000000000000", `min_idle_conns="1000000000000" is over the limit of 65536`},
		{"redis://127.0.0.1:6379/p?pipeline_pool_size=1000000000000", `pipeline_pool_size="1000000000000" is over the limit`},
		{"redis://127.0.0.1:6379/p?pipeline_read_buffer_size=1000000000000", `pipeline_read_buffer_size="1000000000000" is over the limit of 67108864`},
		{"redis://127.0.0.1:6379/p?pipeline_write_buffer_size=1000000000000", `pipeline_write_buffer_size="1000000000000" is over the limit`},
		{"redis://127.0.0.1:6379/p?dial_timeout=-1s", `dial_timeout="-1s" is negative`},
		{"redis://127.0.0.1:6379/p?tls_ca=/x.pem", "need a rediss:// URL"},
		{"rediss://127.0.0.1:6379/p?tls_cert=/x.pem", "go together"},
		{"redis://user:@127.0.0.1:6379/p", `user "user" has an empty password`},
		{"redis+sentinel://127.0.0.1:26379/p", "sentinel URLs and several hosts"},
		{"redis-cluster://127.0.0.1:7000/p", "redis+cluster://host:port,host:port/prefix"},
		{"redis://127.0.0.1:7000/p?addr=127.0.0.1:7001", "sentinel URLs and several hosts"},
		{"redis://127.0.0.1:7000,127.0.0.1:7001/p", "redis+cluster://host:port,host:port/prefix"},
		// A cluster URL takes a one-server URL's options, checked the same way, for each node.
		{"redis+cluster:///p", "needs seed nodes"},
		{"redis+cluster://127.0.0.1:7000,,127.0.0.1:7001/p", "empty node"},
		{"redis+cluster://127.0.0.1:7000,127.0.0.1:0/p", `node "127.0.0.1:0": port "0"`},
		{"redis+cluster://127.0.0.1:x,127.0.0.1:7001/p", `node "127.0.0.1:x": port "x"`},
		{"redis+cluster://127.0.0.1:7000/p?db=2", "only database 0"},
		{"redis+cluster://127.0.0.1:7000/p?pool=0", `pool="0"`},
		{"redis+cluster://127.0.0.1:7000/p?color=red", "unexpected option: color"},
		{"redis+cluster://127.0.0.1:7000/p?tls_ca=/x.pem", "need a rediss:// URL"},
		{"redis+cluster://127.0.0.1:7000/p?addr=127.0.0.1:7001", "sentinel URLs and several hosts"},
		{"rediss+cluster://127.0.0.1:7000/p?tls_ca=/no/such/ca.pem", "/no/such/ca.pem"},
		{"redis://127.0.0.1:6379/a%20b", "space or control"},
		{"mem://", "needs a name"},
		{"mem://x?a=b", "no parameters"},
		{"http://[::1", "missing ']'"},
	} {
		_, err := stores.Open(testCtx(t), c.url, storage.Options{Namespace: ns})
		if !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), c.want) ||
			!strings.HasPrefix(err.Error(), "storage: ") || !strings.Contains(err.Error(), `"`+c.url+`"`) {
			t.Errorf("Open(%q): err=%v; want ErrBadArgument quoting the URL and saying %q", c.url, err, c.want)
		}
	}
	// A URL with a password is quoted without it, even when it does not parse.
	for _, url := range []string{
		"redis://:s3cretPW@127.0.0.1:99999/p",
		"redis://s3cretPW@127.0.0.1:6379/p?color=red",
		"redis://alice:s3cretPW@127.0.0.1:6379/p?ttl=soon",
		"redis://alice:s3cretPW@[::1/p",
		"redis+sentinel://:s3cretPW@127.0.0.1:26379/p",
		"redis+cluster://:s3cretPW@127.0.0.1:7000,127.0.0.1:99999/p",
		"rediss+cluster://alice:s3cretPW@127.0.0.1:7000,127.0.0.1:7001/p?ttl=soon",
	} {
		_, err := stores.Open(testCtx(t), url, storage.Options{Namespace: ns})
		if !errors.Is(err, storage.ErrBadArgument) || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("Open(%q): err=%v; want ErrBadArgument with the password redacted", url, err)
		}
	}
	if _, err := stores.Open(testCtx(t), "redis://127.0.0.1:6379/p", storage.Options{Namespace: ns, PoolSize: 1 << 40}); !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), "pool size 1099511627776") {
		t.Errorf("Open with Options.PoolSize 2^40: %v", err)
	}
	if _, err := stores.Open(testCtx(t), "mem://x", storage.Options{}); !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("Open without a namespace: %v", err)
	}
}
