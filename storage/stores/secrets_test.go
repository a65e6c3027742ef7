package stores_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// TestSecretsNotShown: no error of Open shows a password of the URL, whatever is wrong with
// the URL or the server (internal/redact's tests cover the masking itself).
func TestSecretsNotShown(t *testing.T) {
	const pw = "s3cretPW"
	r := redistest.Start(t, "--requirepass", "right-"+pw)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ns := mustNamespace(t, "secrets")
	for _, url := range []string{
		"redis://:" + pw + "@127.0.0.1:99999/p",                // bad port
		"redis://:" + pw + "@127.0.0.1:6379/p?bogus=1",         // unknown parameter
		"redis://user:" + pw + "@127.0.0.1:6379/p?ttl=forever", // bad parameter value
		"redis://:" + pw + "%zz@127.0.0.1:6379/p",              // does not parse
		"redis://:" + pw + "@/p",                               // no host
		"redis:" + pw + "@127.0.0.1",                           // no //
		"redis://127.0.0.1:6379/p?password=" + pw,              // a password where none goes
		"redis://:" + pw + "@127.0.0.1:" + closed + "/p",       // nobody listening
		"redis://" + pw + "@" + r.Addr() + "/p",                // wrong password
		"redis://default:" + pw + "@" + r.Addr() + "/p",        // wrong password, with a user
		"ftp://:" + pw + "@127.0.0.1/p",                        // unknown scheme
	} {
		_, err := stores.Open(testCtx(t), url, storage.Options{Namespace: ns})
		if err == nil {
			t.Errorf("%s: opened", redact.URL(url))
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	// Nor does a forgery report show the MAC key.
	key := bytes.Repeat([]byte("K"), 32)
	var reports []error
	s := openURL(t, "file://"+t.TempDir(), storage.Options{Namespace: ns, MACKey: key, OnCorrupt: func(err error) { reports = append(reports, err) }})
	defer s.Close()
	k := []storage.Key{storage.NewKey(ns, 1)}
	s.Put(testCtx(t), k, [][]byte{make([]byte, 64)})
	other := openURL(t, "file://"+t.TempDir(), storage.Options{Namespace: ns})
	defer other.Close()
	mutateDirFile(t, s, k[0], func([]byte) []byte {
		other.Put(testCtx(t), k, [][]byte{make([]byte, 64)})
		v, _ := os.ReadFile(stores.DirPath(other, k[0]))
		return v
	})
	if n, _ := s.Get(testCtx(t), k, [][]byte{make([]byte, 64)}, nil); n != 0 || len(reports) != 1 || !errors.Is(reports[0], storage.ErrForged) {
		t.Fatalf("forged page: %d hits, reports %v", n, reports)
	}
	if strings.Contains(reports[0].Error(), string(key)) || strings.Contains(storage.KeyFingerprint(s), string(key[:8])) {
		t.Errorf("the report or fingerprint shows the key: %v", reports[0])
	}
}
