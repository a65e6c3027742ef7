package refmodel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

var variants = []Variant{GQA, MLA, Side}

func newModel(t testing.TB, v Variant) *Model {
	t.Helper()
	m, err := New(DefaultConfig(v))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randomTokens(seed uint64, n, vocab int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 3))
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(vocab))
	}
	return out
}

// kvBytes is every byte of a MemKV's first n positions, layer by layer, part by part.
func kvBytes(t *testing.T, kv *MemKV, n int) []byte {
	t.Helper()
	var out []byte
	for l := range kv.bufs {
		for j := range kv.bpt {
			for pos := range n {
				b, err := kv.TokenKV(l, j, pos)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, b...)
			}
		}
	}
	return out
}

// A prefix's KV computed in one prefill equals, bit for bit, the KV computed token by token
// and in other chunkings, and so do the last logits.
func TestKVIndependentOfChunking(t *testing.T) {
	ctx := context.Background()
	for _, v := range variants {
		t.Run(v.String(), func(t *testing.T) {
			m := newModel(t, v)
			toks := randomTokens(uint64(v), 37, m.cfg.Vocab)
			var refKV []byte
			var refLogits uint64
			for _, chunk := range []int{len(toks), 1, 5, 16} {
				kv := NewMemKV(m)
				var logits []float32
				for start := 0; start < len(toks); start += chunk {
					end := min(start+chunk, len(toks))
					var err error
					logits, err = m.Forward(ctx, Pass{Tokens: toks[:end], Start: start, KV: kv, PageTokens: 4})
					if err != nil {
						t.Fatal(err)
					}
				}
				got := kvBytes(t, kv, len(toks))
				if refKV == nil {
					refKV, refLogits = got, LogitsHash(logits)
					if bytes.Count(got, []byte{0}) == len(got) {
						t.Fatal("the KV is all zero")
					}
					continue
				}
				if !bytes.Equal(got, refKV) {
					t.Errorf("chunks of %d: KV differs from one prefill", chunk)
				}
				if h := LogitsHash(logits); h != refLogits {
					t.Errorf("chunks of %d: last logits hash %#x, one prefill %#x", chunk, h, refLogits)
				}
			}
		})
	}
}

// cpRun generates n tokens after prompt on C in-process CP ranks (each holding only its own
// pages) and returns rank 0's tokens and last-logits hash, after checking every rank agrees.
func cpRun(t *testing.T, m *Model, C int, prompt []int32, n int) ([]int32, uint64) {
	t.Helper()
	ranks := make([]int, C)
	for i := range ranks {
		ranks[i] = i
	}
	gs := local.New(ranks, local.Options{Kind: "attn_cp", Timeout: 30 * time.Second})
	toks := make([][]int32, C)
	hashes := make([]uint64, C)
	errs := make([]error, C)
	var wg sync.WaitGroup
	for r := range C {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var g parallel.Group = gs[r]
			out, logits, err := m.Generate(context.Background(), Pass{KV: NewMemKV(m), PageTokens: 4, Group: g}, prompt, 0, n)
			toks[r], errs[r] = out, err
			if err == nil {
				hashes[r] = LogitsHash(logits)
			}
		}()
	}
	wg.Wait()
	for r := range C {
		if errs[r] != nil {
			t.Fatalf("CP %d rank %d: %v", C, r, errs[r])
		}
		if fmt.Sprint(toks[r]) != fmt.Sprint(toks[0]) || hashes[r] != hashes[0] {
			t.Fatalf("CP %d: rank %d generated %v (%#x), rank 0 %v (%#x)", C, r, toks[r], hashes[r], toks[0], hashes[0])
		}
	}
	return toks[0], hashes[0]
}

// CP 1, 2, 4 and 8 give bit-identical logits and the same greedy tokens: the partials are per
// page and merged in page order whatever rank holds a page.
func TestContextParallelBitIdentical(t *testing.T) {
	for _, v := range variants {
		t.Run(v.String(), func(t *testing.T) {
			m := newModel(t, v)
			prompt := randomTokens(10+uint64(v), 29, m.cfg.Vocab)
			ref, refHash := cpRun(t, m, 1, prompt, 6)
			for _, C := range []int{2, 4, 8} {
				got, h := cpRun(t, m, C, prompt, 6)
				if fmt.Sprint(got) != fmt.Sprint(ref) || h != refHash {
					t.Errorf("CP %d: %v (%#x), CP 1: %v (%#x)", C, got, h, ref, refHash)
				}
			}
		})
	}
}

// The model reads the KV it stores: changing one stored value of a cached position changes
// the next logits (so a cache that returns wrong bytes is seen), in every part of every
// variant, the MLA latent and the side buffer included.
func TestLogitsDependOnEveryPart(t *testing.T) {
	ctx := context.Background()
	for _, v := range variants {
		m := newModel(t, v)
		toks := randomTokens(20+uint64(v), 12, m.cfg.Vocab)
		base := NewMemKV(m)
		if _, err := m.Forward(ctx, Pass{Tokens: toks[:11], KV: base, PageTokens: 4}); err != nil {
			t.Fatal(err)
		}
		ref, err := m.Forward(ctx, Pass{Tokens: toks, Start: 11, KV: clone(base), PageTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		for j, part := range m.layout.Parts {
			kv := clone(base)
			b, _ := kv.TokenKV(2, j, 3)
			b[1] ^= 0x40
			got, err := m.Forward(ctx, Pass{Tokens: toks, Start: 11, KV: kv, PageTokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			if LogitsHash(got) == LogitsHash(ref) {
				t.Errorf("%s: a changed byte of part %q did not change the logits", v, part.Name)
			}
		}
	}
}

func clone(kv *MemKV) *MemKV {
	c := &MemKV{bpt: kv.bpt, bufs: make([][][]byte, len(kv.bufs))}
	for l := range kv.bufs {
		for _, b := range kv.bufs[l] {
			c.bufs[l] = append(c.bufs[l], append([]byte(nil), b...))
		}
	}
	return c
}

func TestBadConfigAndPass(t *testing.T) {
	c := DefaultConfig(GQA)
	c.KVHeads = 3
	if _, err := New(c); !errors.Is(err, ErrBadConfig) {
		t.Errorf("KV heads 3 of 4 heads: %v", err)
	}
	c = DefaultConfig(9)
	if _, err := New(c); !errors.Is(err, ErrBadConfig) {
		t.Errorf("variant 9: %v", err)
	}
	m := newModel(t, GQA)
	for _, p := range []Pass{
		{Tokens: []int32{1}, Start: 1, KV: NewMemKV(m), PageTokens: 4},
		{Tokens: []int32{1}, KV: NewMemKV(m)},
		{Tokens: []int32{512}, KV: NewMemKV(m), PageTokens: 4},
	} {
		if _, err := m.Forward(context.Background(), p); !errors.Is(err, ErrBadConfig) {
			t.Errorf("pass %+v: %v, want ErrBadConfig", p, err)
		}
	}
}
