package refmodel

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cpcache/cpcache/parallel"
)

// KV is where a forward pass keeps KV on one rank.
type KV interface {
	// TokenKV returns the bytes of part `part` of layer `layer` of token position pos (at
	// least the part's bytes per token; the pass reads and writes them). The pass asks only
	// for positions of pages this rank owns (page pos/PageTokens mod C = the rank).
	TokenKV(layer, part, pos int) ([]byte, error)
}

// Pass is one forward pass over Tokens[Start:] on one CP rank.
type Pass struct {
	Tokens     []int32        // the sequence up to and including the tokens to compute
	Start      int            // Tokens[:Start] already have their KV in KV (on their owners)
	KV         KV             // this rank's KV
	PageTokens int            // tokens of a page: page i is CP rank i mod C's
	Group      parallel.Group // the CP group (nil: one rank); every member runs the same pass
	// BeforeLayer, if set, is called before a layer reads any KV (the cache's layer-wise wait
	// for the prefix it loads).
	BeforeLayer func(layer int) error
}

// Forward computes Tokens[Start:], writes the KV of those of them on this rank's pages into
// p.KV, and returns the logits of the last token. Every member of p.Group must call it with
// equal Tokens, Start and PageTokens: it runs one AllGather per layer. Argument errors wrap
// ErrBadConfig; KV's, BeforeLayer's and the group's errors are returned as they are.
func (m *Model) Forward(ctx context.Context, p Pass) ([]float32, error) {
	cfg := m.cfg
	n := len(p.Tokens) - p.Start
	switch {
	case p.Start < 0 || n < 1:
		return nil, fmt.Errorf("%w: start %d of %d tokens leaves nothing to compute", ErrBadConfig, p.Start, len(p.Tokens))
	case p.PageTokens < 1:
		return nil, fmt.Errorf("%w: page tokens %d is not positive", ErrBadConfig, p.PageTokens)
	case p.KV == nil:
		return nil, fmt.Errorf("%w: no KV", ErrBadConfig)
	}
	for _, t := range p.Tokens[p.Start:] {
		if t < 0 || int(t) >= cfg.Vocab {
			return nil, fmt.Errorf("%w: token %d outside the vocabulary [0, %d)", ErrBadConfig, t, cfg.Vocab)
		}
	}
	rank, ranks := 0, 1
	if p.Group != nil {
		rank, ranks = p.Group.Rank(), p.Group.Size()
	}
	P := p.PageTokens
	own := func(pos int) bool { return (pos/P)%ranks == rank }
	d, hd := cfg.Dim, cfg.HeadDim
	x := make([][]float32, n)
	for i := range x {
		x[i] = append([]float32(nil), m.embed[int(p.Tokens[p.Start+i])*d:][:d]...)
	}
	h := make([]float32, d)
	attn := make([]float32, cfg.Heads*hd)
	tmp := make([]float32, d)
	g, u := make([]float32, cfg.FF), make([]float32, cfg.FF)
	for l := range cfg.Layers {
		w := &m.layers[l]
		if p.BeforeLayer != nil {
			if err := p.BeforeLayer(l); err != nil {
				return nil, err
			}
		}
		// Queries of the new tokens; KV of those on this rank's pages written.
		qs := make([]query, n)
		for i := range n {
			pos := p.Start + i
			rmsNorm(h, x[i], w.attnNorm)
			qs[i] = m.project(w, h, pos)
			if own(pos) {
				if err := m.writeKV(p.KV, l, pos, w, h); err != nil {
					return nil, err
				}
			}
		}
		// Keys and values of this rank's positions, read back from KV.
		end := p.Start + n
		keys := make([]key, end)
		for pos := range end {
			if own(pos) {
				k, err := m.readKV(p.KV, l, pos, w)
				if err != nil {
					return nil, err
				}
				keys[pos] = k
			}
		}
		// One partial per (query, own page, head), query-major, pages ascending.
		stride := 2 + hd
		var mine []float32
		for i := range n {
			pos := p.Start + i
			for pg := 0; pg <= pos/P; pg++ {
				if pg%ranks != rank {
					continue
				}
				lo, hi := pg*P, min(pg*P+P, pos+1)
				for hh := range cfg.Heads {
					mine = m.pagePartial(mine, &qs[i], keys[lo:hi], hh)
				}
			}
		}
		parts, err := gather(ctx, p.Group, mine)
		if err != nil {
			return nil, err
		}
		cursor := make([]int, ranks)
		for i := range n {
			pos := p.Start + i
			merged := make([]float32, cfg.Heads*stride)
			for pg := 0; pg <= pos/P; pg++ {
				r := pg % ranks
				if len(parts[r])-cursor[r] < cfg.Heads*stride {
					return nil, fmt.Errorf("refmodel: layer %d: CP rank %d sent %d partial values, too few for page %d of position %d", l, r, len(parts[r]), pg, pos)
				}
				src := parts[r][cursor[r]:][:cfg.Heads*stride]
				cursor[r] += cfg.Heads * stride
				for hh := range cfg.Heads {
					acc, part := merged[hh*stride:][:stride], src[hh*stride:][:stride]
					if pg == 0 {
						copy(acc, part)
						continue
					}
					mx := max(acc[0], part[0])
					a, b := exp32(acc[0]-mx), exp32(part[0]-mx)
					acc[0], acc[1] = mx, float32(acc[1]*a)+float32(part[1]*b)
					for j := range hd {
						acc[2+j] = float32(acc[2+j]*a) + float32(part[2+j]*b)
					}
				}
			}
			for hh := range cfg.Heads {
				acc := merged[hh*stride:][:stride]
				for j := range hd {
					attn[hh*hd+j] = acc[2+j] / acc[1]
				}
			}
			matVec(tmp, w.wo, attn)
			for j := range d {
				x[i][j] += tmp[j]
			}
			rmsNorm(h, x[i], w.mlpNorm)
			matVec(g, w.wg, h)
			matVec(u, w.wu, h)
			for j := range g {
				g[j] = silu(g[j]) * u[j]
			}
			matVec(tmp, w.wd, g)
			for j := range d {
				x[i][j] += tmp[j]
			}
		}
		for r, c := range cursor {
			if c != len(parts[r]) {
				return nil, fmt.Errorf("refmodel: layer %d: CP rank %d sent %d partial values, the pass used %d", l, r, len(parts[r]), c)
			}
		}
	}
	rmsNorm(h, x[n-1], m.finalNorm)
	logits := make([]float32, cfg.Vocab)
	matVec(logits, m.lmHead, h)
	return logits, nil
}

// query is one token's attention inputs: per head the vector scored against keys, and the
// indexer query (Side).
type query struct {
	heads [][]float32
	side  []float32
}

// key is one position's attention inputs read back from KV: per head the key and the value,
// and the indexer key (Side).
type key struct {
	k, v [][]float32
	side []float32
}

func (m *Model) project(w *layerWeights, h []float32, pos int) query {
	cfg := m.cfg
	hd := cfg.HeadDim
	var q query
	switch cfg.Variant {
	case GQA, Side:
		all := make([]float32, cfg.Heads*hd)
		matVec(all, w.wq, h)
		for hh := range cfg.Heads {
			qh := all[hh*hd:][:hd:hd]
			rope(qh, pos)
			q.heads = append(q.heads, qh)
		}
		if cfg.Variant == Side {
			q.side = make([]float32, cfg.SideDim)
			matVec(q.side, w.wqi, h)
		}
	case MLA:
		nope, rp := make([]float32, cfg.Heads*hd), make([]float32, cfg.Heads*cfg.RopeDim)
		matVec(nope, w.wq, h)
		matVec(rp, w.wqr, h)
		for hh := range cfg.Heads {
			r := rp[hh*cfg.RopeDim:][:cfg.RopeDim]
			rope(r, pos)
			q.heads = append(q.heads, append(append([]float32(nil), nope[hh*hd:][:hd]...), r...))
		}
	}
	return q
}

// writeKV computes position pos's KV of layer w from its normed hidden state h and stores
// it as float32 little-endian in the layout's parts.
func (m *Model) writeKV(kv KV, layer, pos int, w *layerWeights, h []float32) error {
	cfg := m.cfg
	put := func(part int, vals []float32) error {
		b, err := kv.TokenKV(layer, part, pos)
		if err != nil {
			return err
		}
		if len(b) < 4*len(vals) {
			return fmt.Errorf("refmodel: layer %d part %d position %d: %d bytes, the part has %d", layer, part, pos, len(b), 4*len(vals))
		}
		for j, v := range vals {
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
		}
		return nil
	}
	switch cfg.Variant {
	case GQA, Side:
		n := cfg.KVHeads * cfg.HeadDim
		k, v := make([]float32, n), make([]float32, n)
		matVec(k, w.wk, h)
		matVec(v, w.wv, h)
		for kh := range cfg.KVHeads {
			rope(k[kh*cfg.HeadDim:][:cfg.HeadDim], pos)
		}
		if err := put(0, k); err != nil {
			return err
		}
		if err := put(1, v); err != nil {
			return err
		}
		if cfg.Variant == Side {
			s := make([]float32, cfg.SideDim)
			matVec(s, w.wi, h)
			return put(2, s)
		}
	case MLA:
		c := make([]float32, cfg.Latent+cfg.RopeDim)
		matVec(c[:cfg.Latent], w.wdkv, h)
		kr := c[cfg.Latent:]
		matVec(kr, w.wkr, h)
		rope(kr, pos)
		return put(0, c)
	}
	return nil
}

// readKV reads position pos's KV of a layer and turns it into per-head keys and values (MLA:
// through the up-projections of the latent).
func (m *Model) readKV(kv KV, layer, pos int, w *layerWeights) (key, error) {
	cfg := m.cfg
	hd := cfg.HeadDim
	get := func(part, n int) ([]float32, error) {
		b, err := kv.TokenKV(layer, part, pos)
		if err != nil {
			return nil, err
		}
		if len(b) < 4*n {
			return nil, fmt.Errorf("refmodel: layer %d part %d position %d: %d bytes, the part has %d", layer, part, pos, len(b), 4*n)
		}
		out := make([]float32, n)
		for j := range out {
			out[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
		}
		return out, nil
	}
	var k key
	switch cfg.Variant {
	case GQA, Side:
		n := cfg.KVHeads * hd
		ks, err := get(0, n)
		if err != nil {
			return k, err
		}
		vs, err := get(1, n)
		if err != nil {
			return k, err
		}
		group := cfg.Heads / cfg.KVHeads
		for hh := range cfg.Heads {
			kh := hh / group
			k.k = append(k.k, ks[kh*hd:][:hd])
			k.v = append(k.v, vs[kh*hd:][:hd])
		}
		if cfg.Variant == Side {
			if k.side, err = get(2, cfg.SideDim); err != nil {
				return k, err
			}
		}
	case MLA:
		c, err := get(0, cfg.Latent+cfg.RopeDim)
		if err != nil {
			return k, err
		}
		lat, kr := c[:cfg.Latent], c[cfg.Latent:]
		uk, uv := make([]float32, cfg.Heads*hd), make([]float32, cfg.Heads*hd)
		matVec(uk, w.wuk, lat)
		matVec(uv, w.wuv, lat)
		for hh := range cfg.Heads {
			k.k = append(k.k, append(append([]float32(nil), uk[hh*hd:][:hd]...), kr...))
			k.v = append(k.v, uv[hh*hd:][:hd])
		}
	}
	return k, nil
}

// pagePartial appends head hh's attention partial of query q over the keys of one page (in
// position order): the running max m, the sum of exp(score - m), and the exp-weighted values.
func (m *Model) pagePartial(dst []float32, q *query, keys []key, hh int) []float32 {
	cfg := m.cfg
	scale := float32(1 / math.Sqrt(float64(len(q.heads[hh]))))
	var sideScale float32
	if cfg.Variant == Side {
		sideScale = float32(1 / math.Sqrt(float64(cfg.SideDim)))
	}
	scores := make([]float32, len(keys))
	mx := float32(math.Inf(-1))
	for t := range keys {
		s := dot(q.heads[hh], keys[t].k[hh]) * scale
		if cfg.Variant == Side {
			s += dot(q.side, keys[t].side) * sideScale
		}
		scores[t] = s
		mx = max(mx, s)
	}
	base := len(dst)
	dst = append(dst, mx, 0)
	dst = append(dst, make([]float32, cfg.HeadDim)...)
	o := dst[base+2:]
	var sum float32
	for t, s := range scores {
		e := exp32(s - mx)
		sum += e
		for j, v := range keys[t].v[hh] {
			o[j] += float32(e * v)
		}
	}
	dst[base+1] = sum
	return dst
}

// gather exchanges the ranks' partials: every rank's values indexed by CP rank.
func gather(ctx context.Context, g parallel.Group, mine []float32) ([][]float32, error) {
	if g == nil || g.Size() == 1 {
		return [][]float32{mine}, nil
	}
	b := make([]byte, 4*len(mine))
	for j, v := range mine {
		binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
	}
	all, err := g.AllGather(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("refmodel: gathering attention partials over %s: %w", g.Name(), err)
	}
	out := make([][]float32, len(all))
	for r, rb := range all {
		if len(rb)%4 != 0 {
			return nil, fmt.Errorf("refmodel: CP rank %d sent %d bytes of partials, not whole float32s", r, len(rb))
		}
		out[r] = make([]float32, len(rb)/4)
		for j := range out[r] {
			out[r][j] = math.Float32frombits(binary.LittleEndian.Uint32(rb[4*j:]))
		}
	}
	return out, nil
}
