package vtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/workload"
)

// CostProfile is the cost model of virtual time: a model and the hardware it runs on,
// resolved against the run's layout (Resolve) into the figures of one replica's step. A step
// lasts
//
//	max(overlap(prefill + decode, load), backup)
//
// where
//
//	prefill = PrefillNsPerToken × computed tokens + AttentionNsPerTokenPair × Σ (n² − h²)/2
//	          (a request of n prompt tokens whose first h were hits computes n − h tokens,
//	          each attending to every token before it)
//	decode  = DecodeStepNs + DecodeNsPerRequest × running requests (when any decodes)
//	load    = bytes loaded back L2→L1 by one rank / H2DGBps (each CP rank loads its pages)
//	backup  = bytes backed up L1→L2 by one rank / D2HGBps (overlaps compute)
//	overlap(compute, load) = compute + load when loads complete whole (pages are opaque: no
//	          KV layout), and with a KV layout of L layers, loaded layer 0 first and read by
//	          each layer's compute as soon as it landed, max(compute, load) + min(compute, load)/L:
//	          max(compute, copy) per layer (CostModel.LoadComputeNs)
//
// and a prefetch from storage of p pages is ready StorageLatencyUs + the bytes of one I/O
// rank / StorageGBps after it was asked: storage bandwidth is per I/O rank, and each CP rank
// reads the pages it owns, so a CP group of C ranks reads C pages in the time of one.
//
// With a model (ModelParamsB > 0) the per-replica figures follow from it and the run:
// prefill is 2 FLOP per parameter per token and attention 4 × layers × attention heads ×
// head dim FLOP per token pair, at GPUTFLOPS × MFU on each of the replica's attn-CP ×
// attn-TP GPUs; a decode step reads the weights (÷ attn-TP) at HBMTBps, and each running
// request its DecodeContextTokens of KV spread over the replica's GPUs; a rank's KV per
// token is layers × 2 (K, V) × its KV heads (kv_heads ÷ attn-TP, at least one) × head dim ×
// dtype bytes. A figure set directly (prefill_ns_per_token, ...) replaces the derived one.
// Without a model every figure is given directly and the KV per token is the profile's, or
// the run's --kv-bytes-per-token when the profile leaves it 0. Nothing sleeps: the clock is
// a number.
type CostProfile struct {
	Name   string `json:"name"`
	Source string `json:"source"` // where every figure comes from

	// The model (all 0: none).
	Model        string  `json:"model,omitempty"`
	ModelParamsB float64 `json:"model_params_b,omitempty"` // parameters, in billions
	ModelLayers  int     `json:"model_layers,omitempty"`
	AttnHeads    int     `json:"attn_heads,omitempty"` // query heads
	KVHeads      int     `json:"kv_heads,omitempty"`
	HeadDim      int     `json:"head_dim,omitempty"`
	DTypeBytes   int     `json:"dtype_bytes,omitempty"` // bytes of one KV (and weight) element
	// DecodeContextTokens: the context a decoding request reads its KV of, per step.
	DecodeContextTokens int `json:"decode_context_tokens,omitempty"`

	// The hardware (with a model): one GPU's dense bf16 TFLOPS, the MFU prefill reaches, and
	// its HBM bandwidth in TB/s.
	GPUTFLOPS float64 `json:"gpu_tflops,omitempty"`
	MFU       float64 `json:"mfu,omitempty"`
	HBMTBps   float64 `json:"hbm_tbps,omitempty"`

	// Figures of one replica's step (with a model: 0 is derived).
	PrefillNsPerToken       float64 `json:"prefill_ns_per_token"`
	AttentionNsPerTokenPair float64 `json:"attention_ns_per_token_pair"`
	DecodeStepNs            float64 `json:"decode_step_ns"`
	DecodeNsPerRequest      float64 `json:"decode_ns_per_request"`
	// Links of one rank: L2 → L1 (host to device) and L1 → L2, GB/s; storage reads of one
	// I/O rank: latency per read and GB/s.
	H2DGBps          float64 `json:"h2d_gbps"`
	D2HGBps          float64 `json:"d2h_gbps"`
	StorageLatencyUs float64 `json:"storage_latency_us"`
	StorageGBps      float64 `json:"storage_gbps"`
	// KVBytesPerToken is one rank's KV per token (0: the model's, else the run's). With a
	// model it must be the model's under the run's attn-TP (Resolve rejects another).
	KVBytesPerToken int `json:"kv_bytes_per_token"`
}

// DefaultCostProfile is the profile `cpcache run` uses without --cost-profile.
const DefaultCostProfile = "h200-llama3-8b-nvme"

// The model and GPU of the built-in H200 profiles, and where their figures come from.
var (
	llama3_8B = CostProfile{Model: "Llama-3.1-8B", ModelParamsB: 8.03, ModelLayers: 32, AttnHeads: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2,
		DecodeContextTokens: 7168, GPUTFLOPS: 989, MFU: 0.4, HBMTBps: 4.8, H2DGBps: 55, D2HGBps: 55}
	llama3_8BSource = "Llama-3.1-8B: 8.03 B parameters, 32 layers, 32 query and 8 KV heads of 128, bf16 (the model's config.json on Hugging Face; " +
		"KV 32 × 2 × 8 × 128 × 2 B = 128 KiB per token, a CP rank holding the whole KV of the pages it owns). " +
		"H200 SXM: 989 TFLOPS dense bf16 and 4.8 TB/s HBM3e (NVIDIA H200 datasheet); prefill at an assumed 40% MFU; " +
		"decode reads the weights once per step and a 7 K-token context's KV per request. L2↔L1: PCIe Gen5 x16 pinned " +
		"host↔device copies, about 55 GB/s each way (measured on this project's H200 by gpu-bundle/run.sh). "
)

// builtinProfiles are the profiles --cost-profile names; each says where its figures come
// from.
var builtinProfiles = map[string]CostProfile{
	"h200-llama3-8b-nvme": with(llama3_8B, CostProfile{Name: "h200-llama3-8b-nvme",
		Source: llama3_8BSource + "Storage: one local NVMe SSD per I/O rank (a DGX H200 has 8 U.2 data drives), PCIe Gen4 x4, " +
			"7 GB/s sequential read (Samsung PM1733 datasheet: 7.0 GB/s; Gen5 drives such as the PM1743 read 13 GB/s) and an assumed 100 µs " +
			"per request (NAND read latency, about 80 µs for a queue-depth-1 read, plus the file system).",
		StorageLatencyUs: 100, StorageGBps: 7}),
	"h200-llama3-8b-redis100": with(llama3_8B, CostProfile{Name: "h200-llama3-8b-redis100",
		Source: llama3_8BSource + "Storage: a remote Redis over a 100 GbE link per I/O rank: 12.5 GB/s line rate, about 10 GB/s of payload, " +
			"and an assumed 200 µs per request (a round trip plus the server's copy of a 2 MiB value). One Redis server's " +
			"own throughput is lower (one thread serves the data path): measure yours and set storage_gbps.",
		StorageLatencyUs: 200, StorageGBps: 10}),
	"h200-llama3-8b-redis400": with(llama3_8B, CostProfile{Name: "h200-llama3-8b-redis400",
		Source: llama3_8BSource + "Storage: a remote Redis (a cluster: one server cannot fill it) over a 400 GbE link per I/O rank " +
			"(a DGX H200 has one ConnectX-7 400 Gb/s port per GPU): 50 GB/s line rate, about 40 GB/s of payload, and an assumed 200 µs per request.",
		StorageLatencyUs: 200, StorageGBps: 40}),
	"unit": {
		Name:   "unit",
		Source: "round numbers for tests and examples, not a measured system",
		// 1 µs per computed token, 1 ms per decode step, 10 µs per running request.
		PrefillNsPerToken: 1000, DecodeStepNs: 1e6, DecodeNsPerRequest: 1e4,
		H2DGBps: 10, D2HGBps: 10, StorageLatencyUs: 1000, StorageGBps: 1,
	},
}

// with returns base with the non-zero fields of p set over it.
func with(base, p CostProfile) CostProfile {
	b, v := reflect.ValueOf(&base).Elem(), reflect.ValueOf(p)
	for i := range v.NumField() {
		if !v.Field(i).IsZero() {
			b.Field(i).Set(v.Field(i))
		}
	}
	return base
}

// CostProfiles are the names of the built-in profiles, sorted.
func CostProfiles() []string { return slices.Sorted(maps.Keys(builtinProfiles)) }

// LoadCostProfile returns the built-in profile called nameOrPath, or reads a profile from
// the JSON file at that path (fields it leaves out are 0), then applies overrides: a
// comma-separated list of json_field=value (e.g. "prefill_ns_per_token=3000,h2d_gbps=25").
// Errors wrap ErrBadProfile and name the bad value.
func LoadCostProfile(nameOrPath, overrides string) (CostProfile, error) {
	if nameOrPath == "" {
		nameOrPath = DefaultCostProfile
	}
	p, ok := builtinProfiles[nameOrPath]
	if !ok {
		b, err := readRegularFile(nameOrPath)
		if err != nil {
			return p, badf("cost profile %q is neither a built-in profile (%s) nor a readable file: %v",
				nameOrPath, strings.Join(CostProfiles(), ", "), err)
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return p, badf("cost profile %s: %v", nameOrPath, err)
		}
		if p.Name == "" {
			p.Name = nameOrPath
		}
	}
	if err := p.override(overrides); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// override sets the fields named in a "field=value,..." list.
func (p *CostProfile) override(list string) error {
	if strings.TrimSpace(list) == "" {
		return nil
	}
	v := reflect.ValueOf(p).Elem()
	fields := map[string]reflect.Value{}
	for i := range v.NumField() {
		tag := strings.Split(v.Type().Field(i).Tag.Get("json"), ",")[0]
		if v.Field(i).Kind() != reflect.String {
			fields[tag] = v.Field(i)
		}
	}
	for _, kv := range strings.Split(list, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, known := fields[k]
		if !ok || !known {
			return badf("--cost %q: want field=value with field one of %s", kv, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		}
		x, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return badf("--cost %s: value %q is not a number", k, val)
		}
		if f.Kind() == reflect.Int {
			if x != math.Trunc(x) || math.Abs(x) > 1<<53 { // int(x) of a larger x is undefined
				return badf("--cost %s: value %q is not a whole number (of at most 2^53)", k, val)
			}
			f.SetInt(int64(x))
		} else {
			f.SetFloat(x)
		}
	}
	p.Name += "+" + list
	return nil
}

// figures are the profile's numbers by JSON name, for validate.
func (p *CostProfile) figures() []struct {
	name string
	v    float64
} {
	return []struct {
		name string
		v    float64
	}{{"model_params_b", p.ModelParamsB}, {"model_layers", float64(p.ModelLayers)}, {"attn_heads", float64(p.AttnHeads)},
		{"kv_heads", float64(p.KVHeads)}, {"head_dim", float64(p.HeadDim)}, {"dtype_bytes", float64(p.DTypeBytes)},
		{"decode_context_tokens", float64(p.DecodeContextTokens)}, {"gpu_tflops", p.GPUTFLOPS}, {"mfu", p.MFU}, {"hbm_tbps", p.HBMTBps},
		{"prefill_ns_per_token", p.PrefillNsPerToken}, {"attention_ns_per_token_pair", p.AttentionNsPerTokenPair},
		{"decode_step_ns", p.DecodeStepNs}, {"decode_ns_per_request", p.DecodeNsPerRequest},
		{"storage_latency_us", p.StorageLatencyUs}, {"h2d_gbps", p.H2DGBps}, {"d2h_gbps", p.D2HGBps},
		{"storage_gbps", p.StorageGBps}, {"kv_bytes_per_token", float64(p.KVBytesPerToken)}}
}

// Validate rejects figures that are not finite numbers (NaN or infinite: the report could
// not even be written), negative figures, bandwidths that are not positive, a model that
// lacks what its costs need, an MFU over 1 and a KV size per token over the run's limit.
func (p *CostProfile) Validate() error {
	for _, f := range p.figures() {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return badf("cost profile %s: %s %g is not a finite number", p.Name, f.name, f.v)
		}
		if f.v < 0 {
			return badf("cost profile %s: %s %g is negative", p.Name, f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"h2d_gbps", p.H2DGBps}, {"d2h_gbps", p.D2HGBps}, {"storage_gbps", p.StorageGBps}} {
		if f.v <= 0 {
			return badf("cost profile %s: %s %g must be positive", p.Name, f.name, f.v)
		}
	}
	if p.ModelParamsB > 0 {
		for _, f := range []struct {
			name string
			v    float64
		}{{"model_layers", float64(p.ModelLayers)}, {"attn_heads", float64(p.AttnHeads)}, {"kv_heads", float64(p.KVHeads)},
			{"head_dim", float64(p.HeadDim)}, {"dtype_bytes", float64(p.DTypeBytes)}, {"gpu_tflops", p.GPUTFLOPS}, {"mfu", p.MFU}, {"hbm_tbps", p.HBMTBps}} {
			if f.v <= 0 {
				return badf("cost profile %s: model_params_b %g needs a positive %s (it is %g)", p.Name, p.ModelParamsB, f.name, f.v)
			}
		}
		if p.MFU > 1 {
			return badf("cost profile %s: mfu %g is over 1", p.Name, p.MFU)
		}
		if kv := p.modelKVBytesPerToken(1); kv > MaxKVBytesPerToken {
			return badf("cost profile %s: the model's KV of %d bytes per token is over the limit of %d", p.Name, kv, MaxKVBytesPerToken)
		}
	}
	if p.KVBytesPerToken > MaxKVBytesPerToken {
		return badf("cost profile %s: kv_bytes_per_token %d is over the limit of %d", p.Name, p.KVBytesPerToken, MaxKVBytesPerToken)
	}
	return nil
}

// modelKVBytesPerToken is the KV one rank of attention-TP size tp holds per token: every
// layer's K and V of its KV heads (sharded across the TP ranks, replicated when there are
// more ranks than heads). Under CP a rank holds the whole KV of the pages it owns.
func (p *CostProfile) modelKVBytesPerToken(tp int) int {
	heads := max((p.KVHeads+tp-1)/tp, 1)
	return p.ModelLayers * 2 * heads * p.HeadDim * p.DTypeBytes
}

// CostModel is a profile resolved against a run (CostProfile.Resolve): the figures of one
// replica's step, and the layout they were derived for.
type CostModel struct {
	PrefillNsPerToken       float64 `json:"prefill_ns_per_token"`
	AttentionNsPerTokenPair float64 `json:"attention_ns_per_token_pair"`
	DecodeStepNs            float64 `json:"decode_step_ns"`
	DecodeNsPerRequest      float64 `json:"decode_ns_per_request"`
	H2DGBps                 float64 `json:"h2d_gbps"`           // one rank's
	D2HGBps                 float64 `json:"d2h_gbps"`           // one rank's
	StorageLatencyUs        float64 `json:"storage_latency_us"` // one read's
	StorageGBps             float64 `json:"storage_gbps"`       // one I/O rank's
	// KVBytesPerToken is one rank's KV per token that the costs charge, from KVSource: the
	// profile's "model", the "profile"'s own figure, or the "run"'s --kv-bytes-per-token.
	// RunKVBytesPerToken is what the run's slabs hold; when the two differ, the slabs are a
	// scaled stand-in (the cache decides by pages, never by bytes) and the costs are the
	// model's.
	KVBytesPerToken    int    `json:"kv_bytes_per_token"`
	KVSource           string `json:"kv_source"`
	RunKVBytesPerToken int    `json:"run_kv_bytes_per_token"`
	PageSize           int    `json:"page_size"`
	CP                 int    `json:"attn_cp"` // ranks of the CP group: each its own loads, backups and storage reads
	TP                 int    `json:"attn_tp"`
	GPUs               int    `json:"gpus"` // GPUs of one replica (attn-CP × attn-TP) that share its prefill
	// Layers is the layers a load-back is copied in, layer 0 of every page first, each read by
	// its layer's compute once it landed (the run's KV layout, --model); 0: pages are opaque,
	// a load completes whole before the step's compute reads it.
	Layers int `json:"layers,omitempty"`
}

// Resolve derives the figures of one replica's step for a run of the layout's attention-CP
// and attention-TP sizes, pageSize tokens per page, runKV bytes of KV per rank per token
// (--kv-bytes-per-token) and the layers of its KV layout (--model; 0 without one: loads
// complete whole). A profile with a model charges the model's KV per rank; one whose
// kv_bytes_per_token differs from its model's under this attn-TP is rejected, naming both.
// Errors wrap ErrBadProfile.
func (p *CostProfile) Resolve(cp, tp, pageSize, runKV, layers int) (CostModel, error) {
	cp, tp = max(cp, 1), max(tp, 1)
	if layers < 0 {
		return CostModel{}, badf("cost model of %s: %d layers is negative", p.Name, layers)
	}
	m := CostModel{Layers: layers, PrefillNsPerToken: p.PrefillNsPerToken, AttentionNsPerTokenPair: p.AttentionNsPerTokenPair,
		DecodeStepNs: p.DecodeStepNs, DecodeNsPerRequest: p.DecodeNsPerRequest, H2DGBps: p.H2DGBps, D2HGBps: p.D2HGBps,
		StorageLatencyUs: p.StorageLatencyUs, StorageGBps: p.StorageGBps,
		KVBytesPerToken: p.KVBytesPerToken, KVSource: "profile", RunKVBytesPerToken: runKV, PageSize: pageSize, CP: cp, TP: tp, GPUs: cp * tp}
	if p.ModelParamsB > 0 {
		kv := p.modelKVBytesPerToken(tp)
		if p.KVBytesPerToken != 0 && p.KVBytesPerToken != kv {
			return m, badf("cost profile %s: kv_bytes_per_token %d is not the KV of its model %s at attn-TP %d (%d layers × 2 × %d KV heads × %d × %d bytes = %d): leave it 0 or change the model",
				p.Name, p.KVBytesPerToken, p.Model, tp, p.ModelLayers, max((p.KVHeads+tp-1)/tp, 1), p.HeadDim, p.DTypeBytes, kv)
		}
		m.KVBytesPerToken, m.KVSource = kv, "model"
		flopsPerNs := p.GPUTFLOPS * 1e3 * p.MFU * float64(m.GPUs) // TFLOPS = 1e3 FLOP per ns
		hbmBytesPerNs := p.HBMTBps * 1e3
		derive := func(f *float64, v float64) {
			if *f == 0 {
				*f = v
			}
		}
		derive(&m.PrefillNsPerToken, 2*p.ModelParamsB*1e9/flopsPerNs)
		derive(&m.AttentionNsPerTokenPair, 4*float64(p.ModelLayers*p.AttnHeads*p.HeadDim)/flopsPerNs)
		derive(&m.DecodeStepNs, p.ModelParamsB*1e9*float64(p.DTypeBytes)/float64(tp)/hbmBytesPerNs)
		derive(&m.DecodeNsPerRequest, float64(p.DecodeContextTokens)*float64(p.modelKVBytesPerToken(1))/float64(m.GPUs)/hbmBytesPerNs)
	} else if m.KVBytesPerToken == 0 {
		m.KVBytesPerToken, m.KVSource = runKV, "run"
	}
	return m, nil
}

// PrefillNs is the compute time of a prefill of n prompt tokens whose first h were hits.
func (m *CostModel) PrefillNs(n, h int) float64 {
	c, nn, hh := float64(n-h), float64(n), float64(h)
	return m.PrefillNsPerToken*c + m.AttentionNsPerTokenPair*(nn*nn-hh*hh)/2
}

// DecodeNs is the time of a decode step of running requests.
func (m *CostModel) DecodeNs(running int) float64 {
	if running == 0 {
		return 0
	}
	return m.DecodeStepNs + m.DecodeNsPerRequest*float64(running)
}

// LoadComputeNs is how long a step's compute (prefill and decode) of compute ns takes with
// load ns of load-back copies that it reads. Without layers (Layers <= 1) the load completes
// before the compute starts: load + compute. With L layers, layer i's compute runs while
// layer i+1 copies: a two-stage pipeline of L layers of load/L and compute/L each, which
// ends after L × max(load, compute)/L — max(compute, copy) per layer — plus the one stage
// that is not overlapped (the first layer's copy or the last layer's compute):
// max(load, compute) + min(load, compute)/L.
func (m *CostModel) LoadComputeNs(compute, load float64) float64 {
	if m.Layers <= 1 {
		return compute + load
	}
	return max(load, compute) + min(load, compute)/float64(m.Layers)
}

// CopyNs is the time to move bytes at gbps GB/s.
func CopyNs(bytes int64, gbps float64) float64 { return float64(bytes) / gbps }

// PageBytes is the KV of one page on the rank that owns it, as the costs charge it.
func (m *CostModel) PageBytes() int64 { return int64(m.PageSize) * int64(m.KVBytesPerToken) }

// PerRankPages is the most pages one rank moves of pages consecutive pages of a sequence
// (page i belongs to CP rank i mod CP).
func (m *CostModel) PerRankPages(pages int) int { return (pages + m.CP - 1) / m.CP }

// StorageNs is the time a prefetch of pages takes: every I/O rank reads the pages it owns
// at its own bandwidth, all at once.
func (m *CostModel) StorageNs(pages int) float64 {
	return m.StorageLatencyUs*1e3 + CopyNs(int64(m.PerRankPages(pages))*m.PageBytes(), m.StorageGBps)
}

// PrefetchCost is the cache's cost rule for these figures: a stored continuation is read only
// when every I/O rank reads its part of it faster than the replica computes it.
func (m *CostModel) PrefetchCost() hicache.PrefetchCost {
	return hicache.PrefetchCost{ComputeNsPerToken: m.PrefillNsPerToken, AttentionNsPerTokenPair: m.AttentionNsPerTokenPair,
		StorageLatencyNs: m.StorageLatencyUs * 1e3, StorageBytesPerNs: m.StorageGBps, PageBytes: m.PageBytes(), IORanks: m.CP}
}

// BreakEven is where reading a prompt's KV from storage starts to pay off against computing
// it, for a replica of the run's layout.
type BreakEven struct {
	// StorageTokensPerS: prompt tokens per second the CP group reads from storage (each I/O
	// rank its own pages, latency aside); PrefillTokensPerS: tokens per second the replica
	// computes at the start of a prompt (the linear term; attention makes later tokens dearer).
	StorageTokensPerS float64 `json:"storage_tokens_per_s"`
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	// MinPromptTokens: the shortest prompt whose KV, read whole from storage (latency and
	// bytes), comes faster than its prefill; a continuation that starts later in a prompt
	// pays off sooner (its tokens attend to more). Never: no prompt length pays off (storage
	// is slower per token and there is no attention term).
	MinPromptTokens float64 `json:"min_prompt_tokens"`
	Never           bool    `json:"never,omitempty"`
	// StorageSlower: reading a token from storage takes longer than computing the first
	// tokens of a prompt: only prompts beyond MinPromptTokens are worth reading.
	StorageSlower bool `json:"storage_slower_per_token"`
}

// SGLangPrefetchThreshold is SGLang HiCache's default prefetch_threshold: a storage hit of
// fewer tokens is not prefetched, whatever the costs.
const SGLangPrefetchThreshold = 256

// BreakEven solves L + s·n = a·n + c·n²/2 for the prompt length n (L: the read latency, s:
// ns per token from storage, a: prefill ns per token, c: attention ns per token pair).
func (m *CostModel) BreakEven() BreakEven {
	s := float64(m.KVBytesPerToken) / (float64(m.CP) * m.StorageGBps) // ns per token: bytes / (bytes per ns)
	a, c, lat := m.PrefillNsPerToken, m.AttentionNsPerTokenPair, m.StorageLatencyUs*1e3
	b := BreakEven{StorageTokensPerS: 1e9 / s, StorageSlower: s >= a}
	if a > 0 {
		b.PrefillTokensPerS = 1e9 / a
	}
	switch {
	case c > 0:
		b.MinPromptTokens = ((s - a) + math.Sqrt((s-a)*(s-a)+2*c*lat)) / c
	case a > s:
		b.MinPromptTokens = lat / (a - s)
	default:
		b.Never = true
	}
	return b
}

// Warning is what the report and stderr say when storage is slower per token than the
// prefill ("": it is not).
func (b *BreakEven) Warning(profile string) string {
	if !b.StorageSlower {
		return ""
	}
	beyond := fmt.Sprintf("only prompts over %.0f tokens are read from storage", b.MinPromptTokens)
	if b.Never {
		beyond = "no prefetch pays off"
	}
	return fmt.Sprintf("cost profile %s: a storage hit is slower than recomputing it (storage %.3g tokens/s against prefill %.3g tokens/s): %s, the rest is computed (skipped for cost)",
		profile, b.StorageTokensPerS, b.PrefillTokensPerS, beyond)
}

// String is the resolved figures, for the report.
func (m *CostModel) String() string {
	overlap := ""
	if m.Layers > 1 {
		overlap = fmt.Sprintf(", load-backs overlap compute layer by layer (%d layers)", m.Layers)
	}
	return fmt.Sprintf("prefill %.0f ns/token + %.3g ns/token pair, decode %.2f ms/step + %.0f µs/request, H2D %g GB/s, D2H %g GB/s, storage %g µs + %g GB/s per I/O rank × %d; KV %s per rank per token (%s)%s",
		m.PrefillNsPerToken, m.AttentionNsPerTokenPair, m.DecodeStepNs/1e6, m.DecodeNsPerRequest/1e3, m.H2DGBps, m.D2HGBps,
		m.StorageLatencyUs, m.StorageGBps, m.CP, HumanBytes(int64(m.KVBytesPerToken)), m.kvNote(), overlap)
}

func (m *CostModel) kvNote() string {
	if m.KVBytesPerToken == m.RunKVBytesPerToken {
		return "the run's"
	}
	return fmt.Sprintf("the %s's; the run's slabs hold %s", m.KVSource, HumanBytes(int64(m.RunKVBytesPerToken)))
}

// String is the profile's name and model, for the report.
func (p *CostProfile) String() string {
	if p.Model == "" {
		return p.Name
	}
	return fmt.Sprintf("%s (%s on %g TFLOPS at %g%% MFU)", p.Name, p.Model, p.GPUTFLOPS, 100*p.MFU)
}

// readRegularFile reads the regular file at path; anything else (a named pipe without a
// writer would block forever) is refused at once (workload.OpenRegularFile).
func readRegularFile(path string) ([]byte, error) {
	f, err := workload.OpenRegularFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// MaxKVBytesPerToken bounds one rank's KV shard per token (a profile's and a run's).
const MaxKVBytesPerToken = 1 << 24

// ErrBadProfile is wrapped by every error about a profile's or an override's values.
var ErrBadProfile = errors.New("bad cost profile")

// badf is an error about a bad value: its text is the message alone, and it wraps
// ErrBadProfile (callers add their own context).
func badf(format string, args ...any) error {
	return &badError{msg: fmt.Sprintf(format, args...)}
}

type badError struct{ msg string }

func (e *badError) Error() string        { return e.msg }
func (e *badError) Is(target error) bool { return target == ErrBadProfile }

// HumanBytes formats n bytes in binary units ("1.5 MiB").
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
