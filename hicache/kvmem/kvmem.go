package kvmem

import (
	"errors"
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvlayout"
)

// ErrBadL1 is wrapped by every error of a bad L1 description (NewL1's *Error) and of a
// chunk or page address out of range.
var ErrBadL1 = errors.New("kvmem: bad L1")

// ErrBadShape is wrapped by NewShape's and ParseL2Layout's errors that are not the layout's
// own (those wrap kvlayout.ErrBadLayout).
var ErrBadShape = errors.New("kvmem: bad shape")

// Error is an L1 description's error: which buffer (Layer and Part; -1 when the error is not
// one buffer's) and why. It wraps ErrBadL1.
type Error struct {
	Layer    int    // the layer, or -1
	Part     int    // the part's index in the layout, or -1
	PartName string // the part's name ("" when Part is -1)
	Reason   string
}

func (e *Error) Error() string {
	switch {
	case e.Layer < 0 && e.Part < 0:
		return "kvmem: " + e.Reason
	case e.Part < 0:
		return fmt.Sprintf("kvmem: layer %d: %s", e.Layer, e.Reason)
	}
	return fmt.Sprintf("kvmem: layer %d part %d (%q): %s", e.Layer, e.Part, e.PartName, e.Reason)
}

func (e *Error) Unwrap() error { return ErrBadL1 }

// L2Layout is how an L2 slab of N pages arranges its pages' chunks.
type L2Layout uint8

const (
	// PageFirst: a page is contiguous and holds every layer, layer 0's parts in layout order,
	// then layer 1's, ...: page p's chunk (l, j) at p×PageBytes + PageFirstOffset(l, j). A
	// page's bytes are its L3 value. SGLang's host pool default.
	PageFirst L2Layout = 1
	// LayerFirst: a slab holds per layer that layer of all its pages: chunk (p, l, j) at
	// l×N×LayerBytes + p×LayerBytes + PartOffset(j).
	LayerFirst L2Layout = 2
)

// String is the name ParseL2Layout takes: "page_first" or "layer_first".
func (l L2Layout) String() string {
	switch l {
	case PageFirst:
		return "page_first"
	case LayerFirst:
		return "layer_first"
	}
	return fmt.Sprintf("l2layout(%d)", uint8(l))
}

// Valid reports whether l is PageFirst or LayerFirst.
func (l L2Layout) Valid() bool { return l == PageFirst || l == LayerFirst }

// ParseL2Layout returns the layout String names ("page_first", "layer_first"); the error
// wraps ErrBadShape and names s.
func ParseL2Layout(s string) (L2Layout, error) {
	switch s {
	case "page_first":
		return PageFirst, nil
	case "layer_first":
		return LayerFirst, nil
	}
	return 0, fmt.Errorf("%w: L2 layout %q is neither page_first nor layer_first", ErrBadShape, s)
}

// Shape is the shape of one page on one rank: a layout at an attention-TP degree and a page
// size in tokens.
type Shape struct {
	layout     kvlayout.Layout
	attnTP     int
	pageTokens int
	bpt        []int   // bytes per token of each part on this rank
	partOff    []int64 // offset of each part's chunk within a layer
	layerBytes int64
}

// NewShape returns the shape of a page of pageTokens tokens of layout on one rank of
// attention-TP attnTP. The error is the layout's (wrapping kvlayout.ErrBadLayout: invalid
// layout, attnTP < 1 or not dividing a sharded part, pageTokens out of range).
func NewShape(layout kvlayout.Layout, attnTP, pageTokens int) (*Shape, error) {
	if _, err := layout.PageBytes(pageTokens, attnTP); err != nil {
		return nil, err
	}
	s := &Shape{layout: layout.Clone(), attnTP: attnTP, pageTokens: pageTokens}
	for j := range layout.Parts {
		b, err := layout.PartBytesPerToken(j, attnTP)
		if err != nil {
			return nil, err
		}
		s.bpt = append(s.bpt, b)
		s.partOff = append(s.partOff, s.layerBytes)
		s.layerBytes += int64(b) * int64(pageTokens)
	}
	return s, nil
}

// Layout returns a copy of the shape's layout.
func (s *Shape) Layout() kvlayout.Layout { return s.layout.Clone() }

// AttnTP is the attention-TP degree the shape is for.
func (s *Shape) AttnTP() int { return s.attnTP }

// PageTokens is P, the tokens of a page.
func (s *Shape) PageTokens() int { return s.pageTokens }

// Layers is the layout's layer count.
func (s *Shape) Layers() int { return s.layout.NumLayers }

// Parts is the number of parts of a layer.
func (s *Shape) Parts() int { return len(s.bpt) }

// PartName is part j's name.
func (s *Shape) PartName(j int) string { return s.layout.Parts[j].Name }

// PartBytesPerToken is part j's bytes per token on this rank.
func (s *Shape) PartBytesPerToken(j int) int { return s.bpt[j] }

// ChunkBytes is the bytes of one chunk of part j: P × its bytes per token on this rank.
func (s *Shape) ChunkBytes(j int) int64 { return int64(s.bpt[j]) * int64(s.pageTokens) }

// PartOffset is the offset of part j's chunk within one layer of a page (the sum of the
// chunk sizes of the parts before it).
func (s *Shape) PartOffset(j int) int64 { return s.partOff[j] }

// LayerBytes is the bytes of one layer of a page: every part's chunk.
func (s *Shape) LayerBytes() int64 { return s.layerBytes }

// PageBytes is the bytes of one page on this rank: Layers × LayerBytes.
func (s *Shape) PageBytes() int64 { return int64(s.layout.NumLayers) * s.layerBytes }

// Chunks is the number of chunks of a page: Layers × Parts.
func (s *Shape) Chunks() int { return s.layout.NumLayers * len(s.bpt) }

// PageFirstOffset is the offset of chunk (layer, part) within a page-first page.
func (s *Shape) PageFirstOffset(layer, part int) int64 {
	return int64(layer)*s.layerBytes + s.partOff[part]
}

// L2ChunkOffset is the offset of chunk (layer, part) of page `page` within a slab of
// pagesPerSlab pages in layout l (see PageFirst and LayerFirst). The error (wrapping
// ErrBadL1) names an out-of-range page, layer, part or layout.
func (s *Shape) L2ChunkOffset(l L2Layout, pagesPerSlab, page, layer, part int) (int64, error) {
	if err := s.checkChunk(layer, part); err != nil {
		return 0, err
	}
	if page < 0 || page >= pagesPerSlab {
		return 0, &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L2 page %d outside a slab of %d pages", page, pagesPerSlab)}
	}
	switch l {
	case PageFirst:
		return int64(page)*s.PageBytes() + s.PageFirstOffset(layer, part), nil
	case LayerFirst:
		return int64(layer)*int64(pagesPerSlab)*s.layerBytes + int64(page)*s.layerBytes + s.partOff[part], nil
	}
	return 0, &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L2 layout %s is neither page_first nor layer_first", l)}
}

func (s *Shape) checkChunk(layer, part int) error {
	if layer < 0 || layer >= s.layout.NumLayers {
		return &Error{Layer: layer, Part: -1, Reason: fmt.Sprintf("layer out of [0, %d)", s.layout.NumLayers)}
	}
	if part < 0 || part >= len(s.bpt) {
		return &Error{Layer: layer, Part: -1, Reason: fmt.Sprintf("part %d out of [0, %d)", part, len(s.bpt))}
	}
	return nil
}

// Equal reports whether s and o describe the same page (layout, attention-TP, page tokens).
func (s *Shape) Equal(o *Shape) bool {
	return s.layout.Equal(o.layout) && s.attnTP == o.attnTP && s.pageTokens == o.pageTokens
}

// String names the shape: "layers=...;... attn_tp=N page_tokens=P page_bytes=B".
func (s *Shape) String() string {
	return fmt.Sprintf("%s attn_tp=%d page_tokens=%d page_bytes=%d", s.layout, s.attnTP, s.pageTokens, s.PageBytes())
}
