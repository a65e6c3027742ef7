package storage_test

import (
	"testing"

	"github.com/cpcache/cpcache/storage"
)

func mustNamespace(t testing.TB, id string) storage.Namespace {
	t.Helper()
	ns, err := storage.NewNamespace(id)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func TestKeys(t *testing.T) {
	a, b := mustNamespace(t, "model=a;page=64"), mustNamespace(t, "model=b;page=64")
	if a == mustNamespace(t, "model=b;page=64") || a != mustNamespace(t, "model=a;page=64") {
		t.Fatal("namespace derivation is not a function of the identity")
	}
	// Fixed hash: these values are part of the storage format and must never change.
	if got := a.String(); got != goldenNamespace {
		t.Errorf("namespace of %q = %s, want %s (the key derivation changed: stored pages are orphaned)", a.Identity(), got, goldenNamespace)
	}
	if got := storage.NewKey(a, 0x0123456789abcdef).String(); got != goldenKey {
		t.Errorf("key = %s, want %s (the key derivation changed)", got, goldenKey)
	}
	ka, kb := storage.NewKey(a, 42), storage.NewKey(b, 42)
	if ka == kb || ka.NamespaceID() != a.ID() || kb.NamespaceID() != b.ID() {
		t.Fatalf("keys of two namespaces: %s %s", ka, kb)
	}
	if storage.NewKey(a, 42) != ka || storage.NewKey(a, 43) == ka {
		t.Fatal("NewKey is not a function of (namespace, hash)")
	}
	// ChainKeys: key i depends on every earlier page and on the parent.
	c1 := storage.ChainKeys(a, storage.Key{}, []uint64{1, 2, 3}, nil)
	c2 := storage.ChainKeys(a, storage.Key{}, []uint64{9, 2, 3}, nil)
	c3 := storage.ChainKeys(a, c1[0], []uint64{2, 3}, nil)
	if len(c1) != 3 || c1[1] == c2[1] || c1[2] == c2[2] || c1[0] == c2[0] {
		t.Fatalf("chained keys do not depend on earlier pages: %v %v", c1, c2)
	}
	if c3[0] != c1[1] || c3[1] != c1[2] {
		t.Fatalf("chaining from a parent differs from chaining the whole sequence")
	}
	if (storage.Namespace{}).IsZero() != true || a.IsZero() {
		t.Fatal("IsZero")
	}
}

const (
	goldenNamespace = "0cc8b8987a846277"
	goldenKey       = "0cc8b8987a846277:a2b7745eb320df9e1d88e45c43c5ac2c"
)
