package kvevents

import (
	"sort"
	"sync"
)

// history keeps the encoded batches the replay socket serves, bounded in bytes: a batch
// costs its payload's capacity plus entryOverhead, and the oldest leave first. A bound of
// 0 keeps nothing.
type history struct {
	bound int64

	mu    sync.Mutex  // guards the rest
	items []sentBatch // oldest first
	bytes int64
	end   uint64 // seq after the newest batch added (kept or not)
}

type sentBatch struct {
	seq     uint64
	payload []byte
}

// entryOverhead is what a kept batch costs beside its payload (its seq and slice header).
const entryOverhead = 32

func (h *history) add(seq uint64, payload []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.end = seq + 1
	if h.bound <= 0 {
		return
	}
	if cap(payload) > len(payload)+len(payload)/8 {
		payload = append([]byte(nil), payload...) // the encoder's buffer may be twice the size
	}
	h.items = append(h.items, sentBatch{seq, payload})
	h.bytes += int64(cap(payload)) + entryOverhead
	drop := 0
	for h.bytes > h.bound && drop < len(h.items) {
		h.bytes -= int64(cap(h.items[drop].payload)) + entryOverhead
		h.items[drop] = sentBatch{}
		drop++
	}
	if drop > 0 {
		h.items = h.items[drop:]
	}
	if len(h.items) == 0 {
		h.items = nil // let the backing array go
	}
}

// next returns the oldest batch kept from seq on, before seq end.
func (h *history) next(seq, end uint64) (sentBatch, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := sort.Search(len(h.items), func(i int) bool { return h.items[i].seq >= seq })
	if i == len(h.items) || h.items[i].seq >= end {
		return sentBatch{}, false
	}
	return h.items[i], true
}

// endSeq is the seq after the newest batch published.
func (h *history) endSeq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.end
}

func (h *history) size() (int, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.items), h.bytes
}
