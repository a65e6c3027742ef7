package core

import "github.com/cpcache/cpcache/slab/alloc"

// Kind is the direction of a transfer.
type Kind int

// Transfer kinds.
const (
	// Write backs pages up: L1 slot → L2 page (this rank's own slab).
	Write Kind = iota
	// Load brings pages back: L2 page → L1 slot.
	Load
)

func (k Kind) String() string {
	if k == Write {
		return "write"
	}
	return "load"
}

// Copy moves one page between an L1 slot and an L2 page; the direction is the transfer's.
type Copy struct {
	L1 int32
	L2 alloc.Page
}

// Transfer is one backup or load-back of one node, as far as this rank is concerned: only
// the pages this rank owns (it writes its own pages into its own slab and reads them back),
// possibly none. Seq orders transfers of one kind; completions are reported by (Kind, Seq).
type Transfer struct {
	Kind   Kind
	Seq    uint64
	Node   uint64 // the node's id, for error messages
	Copies []Copy
}

// Pages is the number of pages the transfer copies.
func (t Transfer) Pages() int { return len(t.Copies) }
