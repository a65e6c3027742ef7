package stores_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cpcache/cpcache/storage/stores"
)

// TestMain gives every test of the package a MAC key through $CPCACHE_STORAGE_KEY_FILE,
// as a deployment would, so that Redis stores open; tests of the key rules override it.
func TestMain(m *testing.M) {
	os.Exit(runWithKeyFile(m))
}

func runWithKeyFile(m *testing.M) int {
	dir, err := os.MkdirTemp("", "storage-test-key-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if _, err := stores.LoadOrCreateKeyFile(filepath.Join(dir, "key")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv(stores.EnvKeyFile, filepath.Join(dir, "key"))
	return m.Run()
}
