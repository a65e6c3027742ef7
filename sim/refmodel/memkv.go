package refmodel

import (
	"context"
	"fmt"
)

// MemKV is a KV in plain memory: per (layer, part) one growing buffer indexed by position
// (positions of pages other ranks own stay zero).
type MemKV struct {
	bpt  []int      // bytes per token of each part
	bufs [][][]byte // [layer][part]
}

// NewMemKV returns an empty MemKV for m's layout at attention-TP 1.
func NewMemKV(m *Model) *MemKV {
	kv := &MemKV{}
	for _, p := range m.layout.Parts {
		kv.bpt = append(kv.bpt, p.BytesPerToken)
	}
	kv.bufs = make([][][]byte, m.layout.NumLayers)
	for l := range kv.bufs {
		kv.bufs[l] = make([][]byte, len(kv.bpt))
	}
	return kv
}

// TokenKV implements KV, growing the buffer to hold pos.
func (kv *MemKV) TokenKV(layer, part, pos int) ([]byte, error) {
	if layer < 0 || layer >= len(kv.bufs) || part < 0 || part >= len(kv.bpt) || pos < 0 {
		return nil, fmt.Errorf("refmodel: MemKV has no layer %d part %d position %d", layer, part, pos)
	}
	b := kv.bpt[part]
	buf := &kv.bufs[layer][part]
	if need := (pos + 1) * b; len(*buf) < need {
		*buf = append(*buf, make([]byte, need-len(*buf))...)
	}
	return (*buf)[pos*b : (pos+1)*b : (pos+1)*b], nil
}

// Generate runs a greedy generation of n tokens after prompt: one forward pass over
// prompt[start:] (prompt[:start] already in p.KV), then one per generated token but the last.
// p.Tokens, p.Start are set by Generate; the rest of p is used as given. It returns the
// generated tokens and the logits of the last pass (the ones the last token was chosen from).
func (m *Model) Generate(ctx context.Context, p Pass, prompt []int32, start, n int) ([]int32, []float32, error) {
	if n < 1 {
		return nil, nil, fmt.Errorf("%w: %d tokens to generate", ErrBadConfig, n)
	}
	seq := append([]int32(nil), prompt...)
	p.Tokens, p.Start = seq, start
	var out []int32
	for {
		logits, err := m.Forward(ctx, p)
		if err != nil {
			return nil, nil, err
		}
		t := Argmax(logits)
		out = append(out, t)
		if len(out) == n {
			return out, logits, nil
		}
		p.Start = len(seq)
		seq = append(seq, t)
		p.Tokens = seq
		p.BeforeLayer = nil // the prefix wait is the prompt's; later passes read only their own KV
	}
}
