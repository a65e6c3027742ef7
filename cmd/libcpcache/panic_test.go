package main

import (
	"errors"
	"strings"
	"testing"
)

// cpcapi_fake_export stands for an exported function (panicSite finds it by its name and
// reports the public one, cpcache_fake_export).
func cpcapi_fake_export(p *int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
	}()
	return errors.New(strings.Repeat("x", *p)) // p == nil: a nil dereference
}

// TestPanicErrorIsOneLine: a panic's error names the exported function, where it panicked and
// the panic value, on one line: the goroutine's stack goes to stderr, never into the message
// a C caller gets from cpcache_last_error.
func TestPanicErrorIsOneLine(t *testing.T) {
	err := cpcapi_fake_export(nil)
	if !errors.Is(err, errInternal) {
		t.Fatalf("err = %v, want errInternal", err)
	}
	msg := err.Error()
	for _, want := range []string{"cpcache_fake_export: panic at panic_test.go:", "invalid memory address or nil pointer dereference"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") || strings.Contains(msg, "goroutine") {
		t.Errorf("message has more than one line, or a stack: %q", msg)
	}
	if got := oneLine(errors.New("a\nb\n\tc")); got != "a b c" {
		t.Errorf("oneLine = %q", got)
	}
}
