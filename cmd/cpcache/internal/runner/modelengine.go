package runner

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/refmodel"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/workload"
)

// Engines (--engine).
const (
	EngineKVTest = "kvtest" // pages of kvtest's bytes, every loaded page checked (the default)
	EngineModel  = "model"  // the reference model computes; every output checked against a cache-off run
)

// modelVariants are --model-variant's values.
var modelVariants = map[string]refmodel.Variant{"gqa": refmodel.GQA, "mla": refmodel.MLA, "side": refmodel.Side}

// checkEngine validates --engine and --model-variant (Prepare calls it before resolveModel)
// and, with --engine model, sets Model to the reference model's KV layout.
func (c *Config) checkEngine(layout *parallel.Layout) error {
	switch c.Engine {
	case "":
		c.Engine = EngineKVTest
	case EngineKVTest, EngineModel:
	default:
		return bad("--engine %q (want %s or %s)", c.Engine, EngineKVTest, EngineModel)
	}
	if c.Engine != EngineModel {
		if c.ModelVariant != "" {
			return bad("--model-variant %s needs --engine %s", c.ModelVariant, EngineModel)
		}
		return nil
	}
	if c.ModelVariant == "" {
		c.ModelVariant = "gqa"
	}
	m, err := c.refModel()
	if err != nil {
		return err
	}
	spec := m.Layout().String()
	switch {
	case c.Model != "" && c.Model != spec:
		return bad("--model %s: --engine %s runs on the reference model's KV layout (%s with --model-variant %s); drop --model", c.Model, EngineModel, spec, c.ModelVariant)
	case layout.AttnTP != 1:
		return bad("--engine %s needs attention-TP 1 (the layout %s has %d): the reference model does not shard its heads", EngineModel, layout, layout.AttnTP)
	case c.Device == DeviceCUDA:
		return bad("--engine %s needs --device %s: the reference model reads its KV from host L1 buffers", EngineModel, DeviceHost)
	}
	c.Model = spec
	return nil
}

// refModel is the reference model of --model-variant.
func (c *Config) refModel() (*refmodel.Model, error) {
	v, ok := modelVariants[c.ModelVariant]
	if !ok {
		return nil, bad("--model-variant %q (want gqa, mla or side)", c.ModelVariant)
	}
	m, err := refmodel.New(refmodel.DefaultConfig(v))
	if err != nil {
		return nil, fmt.Errorf("runner: the reference model: %w", err)
	}
	return m, nil
}

// modelEngine is the reference model doing one rank's compute (sched.Engine): each rank
// holds the KV of the pages it owns (page i on CP rank i mod C) in its per-layer L1 and the
// model merges its attention partials over the rank's attention-CP group. Token t of the
// workload is the model's token t mod its vocabulary (the answers it generates are the
// model's own tokens).
type modelEngine struct {
	m    *refmodel.Model
	l1   *kvmem.L1
	cp   parallel.Group // nil at CP 1
	page int
	reqs map[int]*modelRequest // running requests by ID
	// turns are, by client, the last finished turn of each conversation: its prompt and
	// generated answer, which the next turn's prompt starts with.
	turns map[int]modelTurn
	// damage, if set (tests), breaks the data path: it is called with the L1 slots of the
	// cached prefix pages this rank owns, after the layer-wise wait of layer 0 of a prefill
	// that loaded pages, before the model reads them.
	damage func(l1 *kvmem.L1, slots []int32)

	computed, refComputed int64         // tokens computed with the cache, and by the cache-off reference
	took, refTook         time.Duration // wall time of each (layer waits included in took)
}

// modelRequest is a running request: its sequence, KV and output.
type modelRequest struct {
	req    workload.Request
	seq    []int32 // model tokens: the prompt, then the generated tokens
	kv     *refmodel.L1KV
	hasKV  int     // positions of seq whose KV exists
	gen    []int32 // generated tokens
	logits []float32
}

type modelTurn struct {
	round  int
	prompt []int32
	answer []int32
}

// newModelEngine is the reference model over l1 (the rank's per-layer L1, p's KV layout),
// merging over cp, whose rank must be the cache's CP rank cpRank.
func (p *Plan) newModelEngine(l1 *kvmem.L1, cp parallel.Group, cpRank int) (*modelEngine, error) {
	m, err := p.Config.refModel()
	if err != nil {
		return nil, err
	}
	if l1 == nil {
		return nil, fmt.Errorf("runner: --engine %s has no per-layer L1", EngineModel)
	}
	if got := m.Layout(); !got.Equal(*p.KVLayout) {
		return nil, fmt.Errorf("runner: the reference model's KV layout %s is not the run's %s", got, p.KVLayout)
	}
	C := max(p.Layout.AttnCP, 1)
	switch {
	case C > 1 && cp == nil:
		return nil, fmt.Errorf("runner: --engine %s at CP %d has no attention-CP group", EngineModel, C)
	case cp != nil && (cp.Size() != C || cp.Rank() != cpRank):
		return nil, fmt.Errorf("runner: the attention-CP group %s is rank %d of %d, the cache's CP rank is %d of %d", cp.Name(), cp.Rank(), cp.Size(), cpRank, C)
	}
	if C == 1 {
		cp = nil
	}
	return &modelEngine{m: m, l1: l1, cp: cp, page: p.Config.PageSize, reqs: map[int]*modelRequest{}, turns: map[int]modelTurn{}}, nil
}

// modelTokens maps workload tokens to the model's vocabulary.
func (e *modelEngine) modelTokens(toks []int32) []int32 {
	v := int32(e.m.Config().Vocab)
	out := make([]int32, len(toks))
	for i, t := range toks {
		out[i] = ((t % v) + v) % v
	}
	return out
}

// Prompt implements sched.Engine: turn r of a conversation whose previous turn finished
// starts with that turn's prompt and generated answer instead of the workload's placeholder
// answer (of the same length, so r's length is the workload's).
func (e *modelEngine) Prompt(r workload.Request) (workload.Request, error) {
	if r.Client < 0 || r.Round == 0 {
		return r, nil
	}
	prev, ok := e.turns[r.Client]
	if !ok || prev.round != r.Round-1 {
		return r, nil // not finished yet: r is not admitted before it is
	}
	n := len(prev.prompt) + len(prev.answer)
	if len(r.Tokens) < n {
		return r, fmt.Errorf("runner: request %d (client %d, turn %d) has %d prompt tokens, fewer than its history of %d", r.ID, r.Client, r.Round, len(r.Tokens), n)
	}
	toks := make([]int32, 0, len(r.Tokens))
	toks = append(append(append(toks, prev.prompt...), prev.answer...), r.Tokens[n:]...)
	r.Tokens = toks
	return r, nil
}

// pass is a forward pass over kv.
func (e *modelEngine) pass(kv refmodel.KV) refmodel.Pass {
	return refmodel.Pass{KV: kv, PageTokens: e.page, Group: e.cp}
}

// Prefill implements sched.Engine.
func (e *modelEngine) Prefill(ctx context.Context, r workload.Request, prefix []int32, wait func(layer int) error) error {
	if r.Client >= 0 && r.Round > 0 {
		if prev, ok := e.turns[r.Client]; !ok || prev.round != r.Round-1 {
			return fmt.Errorf("runner: request %d (client %d, turn %d) prefilled before its previous turn finished", r.ID, r.Client, r.Round)
		}
	}
	t0 := time.Now()
	defer func() { e.took += time.Since(t0) }()
	st := &modelRequest{req: r, seq: e.modelTokens(r.Tokens),
		kv: &refmodel.L1KV{L1: e.l1, Slots: slices.Clone(prefix), Scratch: refmodel.NewMemKV(e.m)}}
	start := len(prefix) * e.page
	p := e.pass(st.kv)
	p.Tokens, p.Start = st.seq, start
	var owned []int32
	if e.damage != nil {
		for i, s := range prefix {
			if e.owns(i) {
				owned = append(owned, s)
			}
		}
	}
	if wait != nil {
		p.BeforeLayer = func(layer int) error {
			if err := wait(layer); err != nil {
				return err
			}
			if layer == 0 && e.damage != nil && len(owned) > 0 {
				e.damage(e.l1, owned)
			}
			return nil
		}
	}
	logits, err := e.m.Forward(ctx, p)
	if err != nil {
		return err
	}
	e.computed += int64(len(st.seq) - start)
	st.hasKV, st.logits = len(st.seq), logits
	e.reqs[r.ID] = st
	if r.OutputLen > 0 {
		return e.generated(ctx, st, refmodel.Argmax(logits))
	}
	return nil
}

// owns reports whether this rank owns sequence page i.
func (e *modelEngine) owns(i int) bool {
	if e.cp == nil {
		return true
	}
	return i%e.cp.Size() == e.cp.Rank()
}

// generated appends token t to st's answer; once the answer is complete it also computes
// t's KV (a pass whose logits are not used), since the request is inserted with its answer.
func (e *modelEngine) generated(ctx context.Context, st *modelRequest, t int32) error {
	st.gen = append(st.gen, t)
	st.seq = append(st.seq, t)
	if len(st.gen) < st.req.OutputLen {
		return nil
	}
	_, err := e.forward(ctx, st)
	return err
}

// forward computes the last token of st's sequence (its KV and logits).
func (e *modelEngine) forward(ctx context.Context, st *modelRequest) ([]float32, error) {
	t0 := time.Now()
	defer func() { e.took += time.Since(t0) }()
	p := e.pass(st.kv)
	p.Tokens, p.Start = st.seq, st.hasKV
	logits, err := e.m.Forward(ctx, p)
	if err != nil {
		return nil, err
	}
	e.computed += int64(len(st.seq) - st.hasKV)
	st.hasKV = len(st.seq)
	return logits, nil
}

// request is r's state.
func (e *modelEngine) request(r workload.Request) (*modelRequest, error) {
	st, ok := e.reqs[r.ID]
	if !ok {
		return nil, fmt.Errorf("runner: request %d is not running in the reference model", r.ID)
	}
	return st, nil
}

// Decode implements sched.Engine.
func (e *modelEngine) Decode(ctx context.Context, r workload.Request) error {
	st, err := e.request(r)
	if err != nil {
		return err
	}
	if len(st.gen) >= r.OutputLen {
		return fmt.Errorf("runner: request %d decoded past its %d tokens", r.ID, r.OutputLen)
	}
	logits, err := e.forward(ctx, st)
	if err != nil {
		return err
	}
	st.logits = logits
	return e.generated(ctx, st, refmodel.Argmax(logits))
}

// Answer implements sched.Engine.
func (e *modelEngine) Answer(r workload.Request) []int32 {
	if st, ok := e.reqs[r.ID]; ok {
		return slices.Clone(st.gen)
	}
	return nil
}

// FillPage implements sched.Engine.
func (e *modelEngine) FillPage(r workload.Request, slot int32, index int) error {
	st, err := e.request(r)
	if err != nil {
		return err
	}
	if end := (index + 1) * e.page; end > st.hasKV {
		return fmt.Errorf("runner: request %d: page %d ends at position %d, the model computed KV of %d", r.ID, index, end, st.hasKV)
	}
	return st.kv.StorePage(slot, index)
}

// Finish implements sched.Engine: the cache-off reference is the same request computed from
// its first token over plain memory, on the same CP group (so the same layout).
func (e *modelEngine) Finish(ctx context.Context, r workload.Request) (error, error) {
	st, err := e.request(r)
	if err != nil {
		return nil, err
	}
	delete(e.reqs, r.ID)
	if r.Client >= 0 {
		e.turns[r.Client] = modelTurn{round: r.Round, prompt: r.Tokens, answer: st.gen}
	}
	t0 := time.Now()
	prompt := st.seq[:len(r.Tokens)]
	var toks []int32
	var logits []float32
	if r.OutputLen > 0 {
		toks, logits, err = e.m.Generate(ctx, e.pass(refmodel.NewMemKV(e.m)), prompt, 0, r.OutputLen)
		e.refComputed += int64(len(prompt) + r.OutputLen - 1)
	} else {
		p := e.pass(refmodel.NewMemKV(e.m))
		p.Tokens = prompt
		logits, err = e.m.Forward(ctx, p)
		e.refComputed += int64(len(prompt))
	}
	e.refTook += time.Since(t0)
	if err != nil {
		return nil, fmt.Errorf("runner: request %d: the cache-off reference: %w", r.ID, err)
	}
	got, want := refmodel.LogitsHash(st.logits), refmodel.LogitsHash(logits)
	if !slices.Equal(st.gen, toks) || got != want {
		return fmt.Errorf("%w: request %d (client %d, turn %d): generated %v (logits %016x), without the cache %v (logits %016x)",
			sched.ErrOutputDiffers, r.ID, r.Client, r.Round, st.gen, got, toks, want), nil
	}
	return nil, nil
}
