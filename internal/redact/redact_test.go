package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestURLHidesEverySecret(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"redis://:s3cretPW@127.0.0.1:99999/p", "redis://:xxxxx@127.0.0.1:99999/p"},
		{"redis://user:s3cretPW@host:6379/p", "redis://user:xxxxx@host:6379/p"},
		{"redis://s3cretPW@host/p", "redis://xxxxx@host/p"},
		{"redis://host:6379/p?password=s3cretPW&db=2", "redis://host:6379/p?db=2&password=xxxxx"},
		{"redis://:s3cret%zzPW@host/p", "redis://xxxxx@host/p"},                    // does not parse
		{"redis:s3cretPW@127.0.0.1", "redis:xxxxx@127.0.0.1"},                      // no "//": opaque
		{"redis:s3cretPW@h?token=s3cretTK&db=2", "redis:xxxxx@h?db=2&token=xxxxx"}, // opaque, with a query
		{"file:///tmp/x", "file:///tmp/x"},
		{"not a url", "not a url"},
	} {
		if got := URL(c.raw); got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.raw, got, c.want)
		}
		if strings.Contains(URL(c.raw), "s3cret") {
			t.Errorf("URL(%q) shows the secret", c.raw)
		}
	}
}

func TestErrorMasksAndWraps(t *testing.T) {
	base := errors.New("base")
	for _, raw := range []string{"redis://:s3cretPW@127.0.0.1:99999/p", "redis://:s3cret%zzPW@h/p", "redis://h/p?token=s3cretPW"} {
		err := Error(fmt.Errorf("open %q: %w", raw, base), raw)
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error shows the secret: %v", raw, err)
		}
		if !errors.Is(err, base) {
			t.Errorf("%s: masked error no longer wraps the original", raw)
		}
	}
	plain := errors.New("no secret here")
	if Error(plain, "redis://:pw@h") != plain || Error(nil, "redis://:pw@h") != nil {
		t.Error("an error without a secret (or nil) must come back as is")
	}
}
