package gloo

import (
	"errors"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/parallel"
)

func TestParseStore(t *testing.T) {
	good := map[string]storeSpec{
		"file:///tmp/x":             {scheme: "file", dir: "/tmp/x", prefix: defaultPrefix},
		"redis://10.0.0.1:7000":     {scheme: "redis", host: "10.0.0.1", port: 7000, prefix: defaultPrefix},
		"redis://redis-host":        {scheme: "redis", host: "redis-host", port: 6379, prefix: defaultPrefix},
		"redis://h:1/job42":         {scheme: "redis", host: "h", port: 1, prefix: "job42"},
		"file://localhost/var/lib/": {scheme: "file", dir: "/var/lib/", prefix: defaultPrefix},
		// AUTH: user and password, a password only, a bare user read as the password.
		"redis://u:pw@h:1/p": {scheme: "redis", host: "h", port: 1, prefix: "p", user: "u", password: "pw"},
		"redis://:pw@h:1":    {scheme: "redis", host: "h", port: 1, prefix: defaultPrefix, password: "pw"},
		"redis://pw@h":       {scheme: "redis", host: "h", port: 6379, prefix: defaultPrefix, password: "pw"},
	}
	for in, want := range good {
		want.raw = in
		got, err := parseStore(in)
		if err != nil || got != want {
			t.Errorf("parseStore(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                   "CPCACHE_STORE",
		"file://host/dir":    "file://host/dir",
		"file:relative":      "file:relative",
		"redis://:6379":      "no redis host",
		"redis://h:99999":    `"99999"`,
		"redis://h:port":     `:port`,
		"tcp://h:1":          `"tcp"`,
		"://":                "://",
		"file://%zz":         "%zz",
		"redis://h:0/prefix": `"0"`,
		"file://u:pw@/tmp/x": "takes no user or password",
	}
	for in, mention := range bad {
		_, err := parseStore(in)
		if err == nil {
			t.Errorf("parseStore(%q) succeeded", in)
			continue
		}
		if !strings.HasPrefix(err.Error(), "gloo: ") || !strings.Contains(err.Error(), mention) {
			t.Errorf("parseStore(%q): error %q does not start with \"gloo: \" and mention %q", in, err, mention)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Errorf("parseStore(%q): error %q quotes the password", in, err)
		}
		if !errors.Is(err, parallel.ErrBadArgument) {
			t.Errorf("parseStore(%q): error %q is not parallel.ErrBadArgument", in, err)
		}
	}
}
