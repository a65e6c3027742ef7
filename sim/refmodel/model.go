package refmodel

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/cpcache/cpcache/hicache/kvlayout"
)

// Variant is the attention kind of a model, and so the parts of its KV layout.
type Variant uint8

const (
	// GQA: grouped-query attention; per layer a K and a V part (sharded), RoPE'd K stored.
	GQA Variant = 1
	// MLA: multi-head latent attention; per layer one replicated "latent" part (a latent
	// vector and a RoPE'd shared key) that attention reads through per-head up-projections.
	MLA Variant = 2
	// Side: GQA plus a replicated "idx" side buffer per layer (an indexer key) whose dot
	// product with a query projection biases every attention score.
	Side Variant = 3
)

// String is the variant's name: "gqa", "mla", "side".
func (v Variant) String() string {
	switch v {
	case GQA:
		return "gqa"
	case MLA:
		return "mla"
	case Side:
		return "side"
	}
	return fmt.Sprintf("variant(%d)", uint8(v))
}

// ErrBadConfig is wrapped by New's errors and the forward pass's argument errors.
var ErrBadConfig = errors.New("refmodel: bad config")

// Config is a model's shape and seed.
type Config struct {
	Variant Variant
	Seed    uint64 // weights are a function of Seed and the shape
	Vocab   int    // token ids are in [0, Vocab)
	Dim     int    // hidden size
	Layers  int
	Heads   int // query heads
	KVHeads int // K/V heads (GQA, Side); Heads must be a multiple
	HeadDim int // per-head query/key (GQA) and value size; MLA's non-RoPE key size
	FF      int // SwiGLU hidden size
	Latent  int // MLA latent size
	RopeDim int // MLA shared RoPE key size (even)
	SideDim int // Side: indexer key size
}

// DefaultConfig is the small model of the tests: d=64, 4 layers, vocabulary 512, 4 query
// heads over 2 KV heads of 16, FF 128, MLA latent 32 + 8, a side buffer of 8.
func DefaultConfig(v Variant) Config {
	return Config{Variant: v, Seed: 1, Vocab: 512, Dim: 64, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 16,
		FF: 128, Latent: 32, RopeDim: 8, SideDim: 8}
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	switch {
	case c.Variant != GQA && c.Variant != MLA && c.Variant != Side:
		return bad("variant %s is none of gqa, mla, side", c.Variant)
	case c.Vocab < 2:
		return bad("vocabulary %d below 2", c.Vocab)
	case c.Dim < 2 || c.Layers < 1 || c.Heads < 1 || c.FF < 1:
		return bad("dim %d, layers %d, heads %d, FF %d: each must be positive (dim >= 2)", c.Dim, c.Layers, c.Heads, c.FF)
	case c.HeadDim < 2 || c.HeadDim%2 != 0:
		return bad("head dim %d is not even and >= 2", c.HeadDim)
	}
	switch c.Variant {
	case GQA, Side:
		if c.KVHeads < 1 || c.Heads%c.KVHeads != 0 {
			return bad("heads %d are not a multiple of KV heads %d", c.Heads, c.KVHeads)
		}
		if c.Variant == Side && c.SideDim < 1 {
			return bad("side dim %d is not positive", c.SideDim)
		}
	case MLA:
		if c.Latent < 1 || c.RopeDim < 2 || c.RopeDim%2 != 0 {
			return bad("latent %d must be positive, RoPE dim %d even and >= 2", c.Latent, c.RopeDim)
		}
	}
	return nil
}

// layerWeights are one block's matrices, each row-major [out][in].
type layerWeights struct {
	attnNorm, mlpNorm []float32
	wq, wk, wv, wo    []float32 // GQA/Side: q [Heads×HeadDim], k, v [KVHeads×HeadDim]; MLA: wq is the non-RoPE query [Heads×HeadDim]
	wqi, wi           []float32 // Side: query and key of the indexer [SideDim]
	wqr, wdkv, wkr    []float32 // MLA: RoPE query [Heads×RopeDim], latent down [Latent], shared RoPE key [RopeDim]
	wuk, wuv          []float32 // MLA: per-head up-projections of the latent: [Heads×HeadDim][Latent]
	wg, wu, wd        []float32 // SwiGLU
}

// Model is a deterministic transformer; immutable and safe for concurrent use.
type Model struct {
	cfg       Config
	embed     []float32 // [Vocab][Dim]
	layers    []layerWeights
	finalNorm []float32
	lmHead    []float32 // [Vocab][Dim]
	layout    kvlayout.Layout
}

// New builds the model cfg describes, its weights drawn from cfg.Seed. The error wraps
// ErrBadConfig and names the bad field.
func New(cfg Config) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7265666d6f64656c)) // "refmodel"
	mat := func(out, in int) []float32 {
		w := make([]float32, out*in)
		s := 1 / math.Sqrt(float64(in))
		for i := range w {
			w[i] = float32(rng.NormFloat64() * s)
		}
		return w
	}
	norm := func(n int) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(1 + 0.1*rng.NormFloat64())
		}
		return w
	}
	d, hd := cfg.Dim, cfg.HeadDim
	m := &Model{cfg: cfg, embed: make([]float32, cfg.Vocab*d)}
	for i := range m.embed {
		m.embed[i] = float32(rng.NormFloat64())
	}
	for range cfg.Layers {
		var w layerWeights
		w.attnNorm = norm(d)
		switch cfg.Variant {
		case GQA, Side:
			w.wq, w.wk, w.wv = mat(cfg.Heads*hd, d), mat(cfg.KVHeads*hd, d), mat(cfg.KVHeads*hd, d)
			if cfg.Variant == Side {
				w.wqi, w.wi = mat(cfg.SideDim, d), mat(cfg.SideDim, d)
			}
		case MLA:
			w.wq, w.wqr = mat(cfg.Heads*hd, d), mat(cfg.Heads*cfg.RopeDim, d)
			w.wdkv, w.wkr = mat(cfg.Latent, d), mat(cfg.RopeDim, d)
			w.wuk, w.wuv = mat(cfg.Heads*hd, cfg.Latent), mat(cfg.Heads*hd, cfg.Latent)
		}
		w.wo = mat(d, cfg.Heads*hd)
		w.mlpNorm = norm(d)
		w.wg, w.wu, w.wd = mat(cfg.FF, d), mat(cfg.FF, d), mat(d, cfg.FF)
		m.layers = append(m.layers, w)
	}
	m.finalNorm = norm(d)
	m.lmHead = mat(cfg.Vocab, d)
	m.layout = cfg.layout()
	return m, nil
}

func (c Config) layout() kvlayout.Layout {
	l := kvlayout.Layout{NumLayers: c.Layers}
	switch c.Variant {
	case GQA, Side:
		kv := c.KVHeads * c.HeadDim * 4
		l.Parts = []kvlayout.Part{{Name: "k", BytesPerToken: kv, Sharding: kvlayout.Sharded}, {Name: "v", BytesPerToken: kv, Sharding: kvlayout.Sharded}}
		if c.Variant == Side {
			l.Parts = append(l.Parts, kvlayout.Part{Name: "idx", BytesPerToken: c.SideDim * 4, Sharding: kvlayout.Replicated})
		}
	case MLA:
		l.Parts = []kvlayout.Part{{Name: "latent", BytesPerToken: (c.Latent + c.RopeDim) * 4, Sharding: kvlayout.Replicated}}
	}
	return l
}

// Config returns the model's config.
func (m *Model) Config() Config { return m.cfg }

// Layout returns the model's KV layout (float32 values, little-endian): GQA "k", "v";
// MLA "latent"; Side "k", "v", "idx". The tests run it at attention-TP 1.
func (m *Model) Layout() kvlayout.Layout { return m.layout.Clone() }

// matVec sets out[o] = Σ_i w[o][i]·x[i], summing i in increasing order.
func matVec(out, w, x []float32) {
	in := len(x)
	for o := range out {
		row := w[o*in : (o+1)*in]
		var s float32
		for i, v := range x {
			s += float32(row[i] * v) // the conversion forbids a fused multiply-add (see doc)
		}
		out[o] = s
	}
}

func dot(a, b []float32) float32 {
	var s float32
	for i, v := range a {
		s += float32(v * b[i])
	}
	return s
}

// rmsNorm sets out = x / rms(x) × g.
func rmsNorm(out, x, g []float32) {
	var ss float32
	for _, v := range x {
		ss += float32(v * v)
	}
	r := float32(1 / math.Sqrt(float64(ss/float32(len(x)))+1e-6))
	for i, v := range x {
		out[i] = v * r * g[i]
	}
}

// rope rotates each pair (2i, 2i+1) of x by pos × 10000^(-2i/len(x)).
func rope(x []float32, pos int) {
	n := len(x)
	for i := 0; i < n; i += 2 {
		theta := float64(pos) * math.Pow(10000, -float64(i)/float64(n))
		c, s := float32(math.Cos(theta)), float32(math.Sin(theta))
		a, b := x[i], x[i+1]
		x[i], x[i+1] = float32(a*c)-float32(b*s), float32(a*s)+float32(b*c)
	}
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }

// Argmax is the greedy choice: the index of the largest logit, the lowest on a tie.
func Argmax(logits []float32) int32 {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return int32(best)
}

// LogitsHash is FNV-1a over the logits' float32 bits: equal only for bit-identical logits.
func LogitsHash(logits []float32) uint64 {
	h := uint64(14695981039346656037)
	for _, v := range logits {
		b := math.Float32bits(v)
		for k := 0; k < 4; k++ {
			h ^= uint64(byte(b >> (8 * k)))
			h *= 1099511628211
		}
	}
	return h
}
