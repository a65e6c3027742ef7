// Package sigpipe stops SIGPIPE from killing the process.
//
// Go kills a process by SIGPIPE when it writes to a broken stdout or stderr, and C code
// (Gloo's TCP transport writes to its sockets from C threads without MSG_NOSIGNAL) gets the
// signal's default action. With the signal routed to a channel, the Go runtime delivers it
// there for every thread, and writes to a broken pipe or socket fail with EPIPE instead.
// Child processes do not inherit it: exec restores a caught signal's default.
package sigpipe

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var once sync.Once

// Catch routes SIGPIPE to a channel that is drained and ignored; it is idempotent.
func Catch() {
	once.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGPIPE)
		go func() {
			for range ch {
			}
		}()
	})
}
