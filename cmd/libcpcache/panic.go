package main

import (
	"fmt"
	"os"
	"path"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// A panic in an exported function is a bug of the library (or a wild pointer near NULL from
// the caller, which Go turns into a nil-dereference panic): guard turns it into
// CPCACHE_ERR_INTERNAL whose message is one line — the exported function, where it
// panicked and the panic value — because a C caller logs or shows that message and a
// goroutine dump is neither. The stack goes to stderr, for the first panic of the process
// only; later ones write their one line there.

// panicStackOnce makes only the process's first panic print its stack.
var panicStackOnce sync.Once

// panicError describes the panic r, recovered by the deferred function that calls it. It
// writes the stack to stderr the first time and returns the one-line error.
func panicError(r any) error {
	fn, site := panicSite()
	err := fmt.Errorf("%w: %s: panic at %s: %s", errInternal, fn, site, oneLine(r))
	stack := debug.Stack()
	printed := false
	panicStackOnce.Do(func() {
		printed = true
		fmt.Fprintf(os.Stderr, "libcpcache: %v (a bug of libcpcache, or a bad pointer from its caller; the stack follows, for the first panic only)\n%s", err, stack)
	})
	if !printed {
		fmt.Fprintf(os.Stderr, "libcpcache: %v\n", err)
	}
	return err
}

// oneLine is the panic value as one line of text.
func oneLine(r any) string {
	var s string
	if e, ok := r.(error); ok {
		s = e.Error()
	} else {
		s = fmt.Sprint(r)
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// panicSite reads the stack of a goroutine that is panicking (called from a deferred
// function): the innermost frame outside the runtime below runtime.gopanic, where the panic
// happened ("exports.go:123 (main.cpcapi_match)"), and the exported function it ran in,
// by its public name (the first main.cpcapi_* frame, cpcapi_match: "cpcache_match").
func panicSite() (exported, site string) {
	pcs := make([]uintptr, 128)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	exported, site = "libcpcache", "an unknown place"
	inPanic, siteFound := false, false
	for {
		f, more := frames.Next()
		name := f.Function[strings.LastIndex(f.Function, "/")+1:] // "main.cpcapi_match"
		if name == "runtime.gopanic" {
			inPanic = true
		}
		if inPanic && !siteFound && name != "" && !strings.HasPrefix(name, "runtime.") {
			site = fmt.Sprintf("%s:%d (%s)", path.Base(f.File), f.Line, name)
			siteFound = true
		}
		if _, fn, _ := strings.Cut(name, "."); inPanic && strings.HasPrefix(fn, "cpcapi_") && !strings.Contains(fn, ".") {
			exported = "cpcache_" + strings.TrimPrefix(fn, "cpcapi_")
			break
		}
		if !more {
			break
		}
	}
	return exported, site
}
