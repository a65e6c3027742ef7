package stores_test

import (
	"bytes"
	"testing"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// redisBenchModes are the stores BenchmarkRedisPages opens: "mac" authenticates every
// value (the default), "nomac" only checksums it (Options.Insecure).
func redisBenchModes() []redisBenchMode {
	return []redisBenchMode{
		{"mac", func(_ *testing.B, ns storage.Namespace) storage.Options {
			return storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("k"), 32)}
		}},
		{"nomac", func(b *testing.B, ns storage.Namespace) storage.Options {
			b.Setenv(stores.EnvKeyFile, "") // TestMain's key file would win over Insecure
			return storage.Options{Namespace: ns, Insecure: true}
		}},
	}
}
