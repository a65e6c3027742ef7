package gloo

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var sigpipeOnce sync.Once

// catchSIGPIPE stops SIGPIPE from killing the process. Gloo's TCP transport writes to its
// sockets from C threads without MSG_NOSIGNAL, so a peer that exits mid-write would otherwise
// terminate this rank instead of letting the write fail (and the collective report
// parallel.ErrPeerLost). With the signal routed to a channel, the Go runtime delivers it there
// for every thread, and writes to a broken pipe return EPIPE: this also applies to the
// process's own stdout and stderr.
func catchSIGPIPE() {
	sigpipeOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGPIPE)
		go func() {
			for range ch {
			}
		}()
	})
}
