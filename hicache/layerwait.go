package hicache

import (
	"context"
	"fmt"
	"slices"
)

// loadTickets returns the tickets of this rank's loads in flight on node h's prefix (none when
// nothing loads there), or the error WaitL1 documents: the cache is closed, h names no node
// (*core.StaleHandleError), or a load was chosen but starts only at the next Step
// (ErrNotStarted).
func (c *Cache) loadTickets(h Handle) ([]*Ticket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	seqs, err := c.core.Loading(h)
	if err != nil {
		return nil, err
	}
	var tks []*Ticket
	for _, seq := range seqs {
		i := slices.IndexFunc(c.loadTks, func(tk *Ticket) bool { return tk.Transfer.Seq == seq })
		if i < 0 {
			return nil, fmt.Errorf("%w: load %d on the prefix of node %#x starts at the next Step", ErrNotStarted, seq, uint64(h))
		}
		tks = append(tks, c.loadTks[i])
	}
	return tks, nil
}

// checkLayerIndex rejects a negative layer, before anything else is looked at.
func checkLayerIndex(layer int) error {
	if layer < 0 {
		return fmt.Errorf("%w: layer %d is negative", ErrBadArgument, layer)
	}
	return nil
}

// checkLayer rejects a layer at or beyond the layers of a load of tks that the engine copies
// layer by layer (an engine that copies a load whole reports one layer, the whole transfer,
// so every layer >= 0 waits for it).
func checkLayer(tks []*Ticket, layer int) error {
	for _, tk := range tks {
		if n := tk.Layers(); n > 1 && layer >= n {
			return fmt.Errorf("%w: layer %d, but the load of node %d is copied in %d layers (0..%d)", ErrBadArgument, layer, tk.Transfer.Node, n, n-1)
		}
	}
	return nil
}

// layerTickets returns the load tickets a wait for layer `layer` of node h's prefix waits on:
// checkLayerIndex, loadTickets and checkLayer, in that order.
func (c *Cache) layerTickets(h Handle, layer int) ([]*Ticket, error) {
	if err := checkLayerIndex(layer); err != nil {
		return nil, err
	}
	tks, err := c.loadTickets(h)
	if err != nil {
		return nil, err
	}
	if err := checkLayer(tks, layer); err != nil {
		return nil, err
	}
	return tks, nil
}

// WaitL1Layer is WaitL1 for one layer: it blocks until layer `layer` of this rank's copies of
// every load in flight on node h's prefix landed in L1, so that the layer's attention can read
// the prefix while the later layers are still copying (the engine copies layer 0 of every page
// of a load first, then layer 1, ...: see engine.NewLayeredTicket). With an engine that copies
// a load whole (one layer per ticket), it waits for the whole load. The rules are WaitL1's:
// call it after the Step that follows the LoadBack (before it: an error wrapping ErrNotStarted
// at once); a handle that names no node returns a *core.StaleHandleError; a failed load returns
// its error on this rank only (act on LoadPending and Match, as after WaitL1); ctx bounds the
// wait. A negative layer, or one beyond a layered load's layers, is an error wrapping
// ErrBadArgument naming it. Local.
func (c *Cache) WaitL1Layer(ctx context.Context, h Handle, layer int) error {
	tks, err := c.layerTickets(h, layer)
	if err != nil {
		return err
	}
	for _, tk := range tks {
		select {
		case <-tk.LayerDone(layer):
			if err := tk.LayerErr(layer); err != nil {
				return fmt.Errorf("hicache: load of node %d: %w", tk.Transfer.Node, err)
			}
		case <-ctx.Done():
			return fmt.Errorf("hicache: waiting for layer %d of the load of node %d: %w", layer, tk.Transfer.Node, ctx.Err())
		}
	}
	return nil
}

// WaitL1LayerOn makes the engine's compute stream `stream` (a CUstream handle; 0 is the legacy
// default stream) wait for layer `layer` of this rank's copies of every load in flight on node
// h's prefix, without blocking the calling thread: kernels enqueued on the stream afterwards
// run once that layer landed (cuStreamWaitEvent on the layer's event). It returns at once. The
// engine must implement StreamWaiter (cudaengine does); another engine returns an error
// wrapping ErrUnsupported naming it (use WaitL1Layer). The other rules are WaitL1Layer's: an
// error wrapping ErrNotStarted before the Step that starts the loads, a *core.StaleHandleError
// for a handle that names no node, ErrBadArgument for a bad layer, and a load that already
// failed returns its error (nothing is enqueued for it). Local.
func (c *Cache) WaitL1LayerOn(h Handle, layer int, stream uintptr) error {
	sw, ok := c.engine.(StreamWaiter)
	if !ok {
		return fmt.Errorf("%w: engine %T cannot make a stream wait for a layer (its L1 is not device memory with per-layer events): use WaitL1Layer", ErrUnsupported, c.engine)
	}
	tks, err := c.layerTickets(h, layer)
	if err != nil {
		return err
	}
	for _, tk := range tks {
		if tk.Finished() {
			if err := tk.Err(); err != nil {
				return fmt.Errorf("hicache: load of node %d: %w", tk.Transfer.Node, err)
			}
		}
		if err := sw.WaitLayerOn(tk, layer, stream); err != nil {
			return fmt.Errorf("hicache: stream %#x waiting for layer %d of the load of node %d: %w", stream, layer, tk.Transfer.Node, err)
		}
	}
	return nil
}
