package refmodel

import (
	"context"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvmem"
)

// Pages stored into a per-layer L1 (token-slot buffers, and vLLM's block-major tensors whose
// token stride is not a page's) at scattered slots read back as the same prefix: the next
// token's logits equal those computed over plain memory; a prefix page is not storable.
func TestL1KVStoreAndRead(t *testing.T) {
	ctx := context.Background()
	const P = 4
	for _, v := range variants {
		m := newModel(t, v)
		shape, err := kvmem.NewShape(m.Layout(), 1, P)
		if err != nil {
			t.Fatal(err)
		}
		for name, bufs := range map[string][]kvmem.Buffer{
			"token_slot":  kvmem.AllocTokenSlotBuffers(shape, 8),
			"block_major": kvmem.BlockMajorBuffers(shape, 8, func(int) []byte { return make([]byte, 8*shape.LayerBytes()) }),
		} {
			l1, err := kvmem.NewL1(shape, 8, bufs)
			if err != nil {
				t.Fatal(err)
			}
			toks := randomTokens(30+uint64(v), 13, m.cfg.Vocab)
			scratch := NewMemKV(m)
			if _, err := m.Forward(ctx, Pass{Tokens: toks[:12], KV: scratch, PageTokens: P}); err != nil {
				t.Fatal(err)
			}
			slots := []int32{5, 2, 7}
			fill := &L1KV{L1: l1, Scratch: scratch}
			for pg, s := range slots {
				if err := fill.StorePage(s, pg); err != nil {
					t.Fatal(err)
				}
			}
			want, err := m.Forward(ctx, Pass{Tokens: toks, Start: 12, KV: scratch, PageTokens: P})
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Forward(ctx, Pass{Tokens: toks, Start: 12, KV: &L1KV{L1: l1, Slots: slots, Scratch: NewMemKV(m)}, PageTokens: P})
			if err != nil {
				t.Fatal(err)
			}
			if LogitsHash(got) != LogitsHash(want) {
				t.Errorf("%s %s: logits over the L1 prefix differ from plain memory's", v, name)
			}
			if err := (&L1KV{L1: l1, Slots: slots, Scratch: scratch}).StorePage(0, 1); err == nil {
				t.Errorf("%s %s: storing prefix page 1 succeeded", v, name)
			}
		}
	}
}

// In the engine-owned use the forward pass writes the new pages' KV straight into their L1
// slots (a page with slot -1 stays in Scratch): the logits equal plain memory's, every slot
// holds the bytes StorePage would have copied there, and only a Scratch page is storable.
func TestL1KVWritesNewPagesIntoSlots(t *testing.T) {
	ctx := context.Background()
	const P = 4
	for _, v := range variants {
		m := newModel(t, v)
		shape, err := kvmem.NewShape(m.Layout(), 1, P)
		if err != nil {
			t.Fatal(err)
		}
		l1, err := kvmem.NewL1(shape, 8, kvmem.AllocTokenSlotBuffers(shape, 8))
		if err != nil {
			t.Fatal(err)
		}
		toks := randomTokens(40+uint64(v), 13, m.cfg.Vocab)
		plain := NewMemKV(m)
		want, err := m.Forward(ctx, Pass{Tokens: toks, KV: plain, PageTokens: P})
		if err != nil {
			t.Fatal(err)
		}
		slots := []int32{6, -1, 3} // page 1 in Scratch, page 3 (one token) past the end
		kv := &L1KV{L1: l1, Slots: slots, Scratch: NewMemKV(m)}
		got, err := m.Forward(ctx, Pass{Tokens: toks, KV: kv, PageTokens: P})
		if err != nil {
			t.Fatal(err)
		}
		if LogitsHash(got) != LogitsHash(want) {
			t.Errorf("%s: logits with the KV in L1 slots differ from plain memory's", v)
		}
		ref := &L1KV{L1: l1, Scratch: plain}
		for pg, s := range []int32{6, 1, 3} { // slot 1 gets page 1 from Scratch, compared below
			if slots[pg] < 0 {
				if err := kv.StorePage(s, pg); err != nil {
					t.Fatalf("%s: storing Scratch page %d: %v", v, pg, err)
				}
			}
			if err := ref.StorePage(0, pg); err != nil { // the reference bytes, in slot 0
				t.Fatal(err)
			}
			for layer := range shape.Layers() {
				for part := range shape.Parts() {
					a, _ := l1.HostChunk(s, layer, part)
					b, _ := l1.HostChunk(0, layer, part)
					if string(a) != string(b) {
						t.Fatalf("%s: page %d's layer %d part %d in slot %d differs from plain memory's", v, pg, layer, part, s)
					}
				}
			}
		}
		if err := kv.StorePage(2, 0); err == nil {
			t.Errorf("%s: storing page 0, which lives in slot 6, succeeded", v)
		}
	}
}
