package kvlayout

import (
	"slices"
	"strings"
)

// Bytes of one element of the KV dtypes the presets use.
const (
	bf16 = 2
	fp8  = 1
)

// mha is the K and V parts of an MHA/GQA model: each holds kvHeads × headDim elements per
// token and layer, split over attention-TP by KV head.
func mha(layers, kvHeads, headDim, elem int) Layout {
	b := kvHeads * headDim * elem
	return Layout{NumLayers: layers, Parts: []Part{
		{Name: "k", BytesPerToken: b, Sharding: Sharded},
		{Name: "v", BytesPerToken: b, Sharding: Sharded},
	}}
}

// presets are the layouts a user can name. Each figure is from the model's public
// config.json on its Hugging Face model page.
var presets = map[string]func() Layout{
	// meta-llama/Meta-Llama-3-8B: num_hidden_layers 32, num_key_value_heads 8, head_dim 128
	// (hidden_size 4096 / num_attention_heads 32), torch_dtype bfloat16: K and V of
	// 8 × 128 × 2 = 2048 bytes per token and layer each.
	"llama-3-8b": func() Layout { return mha(32, 8, 128, bf16) },
	// meta-llama/Meta-Llama-3-70B: num_hidden_layers 80, num_key_value_heads 8, head_dim 128
	// (hidden_size 8192 / num_attention_heads 64), torch_dtype bfloat16. At attention-TP 8 each
	// rank holds one KV head: 256 bytes per token and layer of K and of V.
	"llama-3-70b": func() Layout { return mha(80, 8, 128, bf16) },
	// deepseek-ai/DeepSeek-V3: num_hidden_layers 61, kv_lora_rank 512, qk_rope_head_dim 64. MLA
	// caches one latent per token and layer, the compressed KV (512) and the rotary key (64),
	// kept in bf16 (the KV cache dtype engines use by default; the fp8 of its
	// quantization_config is the weights'): (512 + 64) × 2 = 1152 bytes, the same on every
	// attention-TP rank.
	"deepseek-v3": func() Layout {
		return Layout{NumLayers: 61, Parts: []Part{{Name: "kv", BytesPerToken: (512 + 64) * bf16, Sharding: Replicated}}}
	},
	// llama-3-8b plus a side buffer per layer that must travel with the page: "indexer", the
	// keys of a sparse-attention indexer, 128 × fp8 = 128 bytes per token, replicated. Llama 3
	// has no indexer; the preset exists to exercise side buffers, and its figures are those of
	// DeepSeek-V3.2's lightning indexer (deepseek-ai/DeepSeek-V3.2-Exp: index_head_dim 128, keys
	// cached in fp8; the fp32 scale an engine keeps beside each key is left out).
	"llama-3-8b-indexer": func() Layout {
		l := mha(32, 8, 128, bf16)
		l.Parts = append(l.Parts, Part{Name: "indexer", BytesPerToken: 128 * fp8, Sharding: Replicated})
		return l
	},
}

// PresetNames returns the names Preset knows, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for name := range presets {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Preset returns the layout of a named model (PresetNames lists them); each call returns a
// fresh copy. The error for an unknown name (an *Error wrapping ErrBadLayout) lists the known
// ones.
func Preset(name string) (Layout, error) {
	f, ok := presets[name]
	if !ok {
		return Layout{}, layoutErr("unknown preset %q (known: %s)", name, strings.Join(PresetNames(), ", "))
	}
	return f(), nil
}
