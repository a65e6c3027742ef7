package engine

import "errors"

// ErrUnsupported: the engine does not offer what was asked (a stream wait on an engine whose
// L1 is host memory: see StreamWaiter). Package hicache re-exports it.
var ErrUnsupported = errors.New("hicache: not supported by the engine")

// StreamWaiter is implemented by engines whose L1 is device memory and whose loads record an
// event after each layer (cudaengine): WaitLayerOn makes the caller's compute stream wait for
// layer `layer` of tk's transfer — every page of that layer landed in L1 — without blocking
// the host thread (cuStreamWaitEvent). It returns at once: the stream, not the caller, waits.
// stream is the engine's stream handle (a CUstream; 0 is the legacy default stream). A layer
// at or beyond tk.Layers() is the whole transfer. It returns an error, and enqueues nothing,
// when tk is not one of the engine's tickets or the wait cannot be enqueued; a transfer that
// failed returns its error (the layers of a failed load are never served).
type StreamWaiter interface {
	WaitLayerOn(tk *Ticket, layer int, stream uintptr) error
}
