package storage_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
)

// TestSecretsNotShown: no error of Open shows a password of the URL, whatever is wrong with
// the URL or the server, and RedactURL hides them for reports.
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
		_, err := storage.Open(testCtx(t), url, storage.Options{Namespace: ns})
		if err == nil {
			t.Errorf("%s: opened", storage.RedactURL(url))
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	for url, want := range map[string]string{
		"redis://:" + pw + "@h:1/p":            "redis://:xxxxx@h:1/p",
		"redis://" + pw + "@h:1/p":             "redis://xxxxx@h:1/p",
		"redis://u:" + pw + "@h/p?ttl=1h":      "redis://u:xxxxx@h/p?ttl=1h",
		"redis://user:@h/p":                    "redis://user:@h/p",
		"redis://h/p?ttl=1h&password=" + pw:    "redis://h/p?ttl=1h&password=xxxxx",
		"redis://:" + pw + "%zz@h:99999:9/p?x": "redis://:xxxxx@h:99999:9/p?x",
		"redis://u:" + pw + "@[::1/p":          "redis://u:xxxxx@[::1/p",
		"redis:" + pw + "@h":                   "redis:xxxxx@h",
		"file:///var/cache/cpcache?fsync=true": "file:///var/cache/cpcache?fsync=true",
		"redis://h:6379/p@q":                   "redis://h:6379/p@q",
		"redis://a@b:" + pw + "@h/p?auth_t=1":  "redis://a@b:xxxxx@h/p?auth_t=xxxxx",
	} {
		if got := storage.RedactURL(url); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", url, got, want)
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
		v, _ := os.ReadFile(storage.DirPath(other, k[0]))
		return v
	})
	if n, _ := s.Get(testCtx(t), k, [][]byte{make([]byte, 64)}, nil); n != 0 || len(reports) != 1 || !errors.Is(reports[0], storage.ErrForged) {
		t.Fatalf("forged page: %d hits, reports %v", n, reports)
	}
	if strings.Contains(reports[0].Error(), string(key)) || strings.Contains(storage.KeyFingerprint(s), string(key[:8])) {
		t.Errorf("the report or fingerprint shows the key: %v", reports[0])
	}
}
