package gloo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestNewWorldEndsPromptlyWhenCancelled: rank 0 of a world of 2 waits in rendezvous for a
// rank 1 that never comes; cancelling its context (what a SIGINT does) ends NewWorld within
// a second, long before the 30 s timeout.
func TestNewWorldEndsPromptlyWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	g, err := NewWorld(ctx, Options{Store: "file://" + t.TempDir(), Rank: 0, Size: 2, Timeout: 30 * time.Second, Hostname: "127.0.0.1"})
	took := time.Since(start)
	if err == nil {
		g.Close()
		t.Fatal("NewWorld succeeded without its peer")
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("error %v, want one wrapping context.Canceled", err)
	}
	if took > time.Second+200*time.Millisecond {
		t.Errorf("NewWorld returned %v after start, want within a second of the cancellation", took)
	}
}

func TestCheckStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, c := range []struct{ url, want string }{
		{"file://" + dir, ""},
		{"file://" + dir + "/not/yet/made", ""},
		{"file:///proc/self/status/x", "not a directory"},
		{"redis://:s3cretPW@127.0.0.1:99999/p", "bad port"},
		{"redis://127.0.0.1:99999/p", "bad port"},
		{"redis://127.0.0.1:1/p", "unreachable"},
		{"ftp://h/x", "unknown scheme"},
	} {
		err := CheckStore(ctx, c.url)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want ok", c.url, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error containing %q", c.url, err, c.want)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
}
