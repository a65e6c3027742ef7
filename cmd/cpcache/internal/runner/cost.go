package runner

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/cpcache/cpcache/workload"
)

// CostProfile is the cost model of virtual time: how long a scheduler step of one replica
// takes, from what the step did. Every figure is for one replica (a CP group); a step lasts
//
//	max(prefill + decode + load, backup)
//
// where
//
//	prefill = PrefillNsPerToken × computed tokens + AttentionNsPerTokenPair × Σ (n² − h²)/2
//	          (a request of n prompt tokens whose first h were hits computes n − h tokens,
//	          each attending to every token before it)
//	decode  = DecodeStepNs + DecodeNsPerRequest × running requests (when any decodes)
//	load    = bytes loaded back L2→L1 by one rank / H2DGBps (each CP rank loads its pages)
//	backup  = bytes backed up L1→L2 by one rank / D2HGBps (overlaps compute)
//
// and a prefetch from storage of p pages is ready StorageLatencyUs + p pages' bytes /
// StorageGBps after it was asked. A page's bytes are PageSize × KVBytesPerToken of the
// profile (its model), or of the run when the profile leaves it 0. Nothing sleeps: the
// clock is a number.
type CostProfile struct {
	Name   string `json:"name"`
	Source string `json:"source"` // where the figures come from

	PrefillNsPerToken       float64 `json:"prefill_ns_per_token"`
	AttentionNsPerTokenPair float64 `json:"attention_ns_per_token_pair"`
	DecodeStepNs            float64 `json:"decode_step_ns"`
	DecodeNsPerRequest      float64 `json:"decode_ns_per_request"`
	H2DGBps                 float64 `json:"h2d_gbps"` // L2 → L1 (host to device), GB/s
	D2HGBps                 float64 `json:"d2h_gbps"` // L1 → L2 (device to host), GB/s
	StorageLatencyUs        float64 `json:"storage_latency_us"`
	StorageGBps             float64 `json:"storage_gbps"`
	KVBytesPerToken         int     `json:"kv_bytes_per_token"` // KV of one rank per token (0: the run's)
}

// DefaultCostProfile is the profile `cpcache run` uses without --cost-profile.
const DefaultCostProfile = "h200-llama3-8b-cp8"

// builtinProfiles are the profiles --cost-profile names; each says where its figures come
// from.
var builtinProfiles = map[string]CostProfile{
	"h200-llama3-8b-cp8": {
		Name: "h200-llama3-8b-cp8",
		Source: "Llama-3.1-8B (8.0 B parameters, 32 layers, 8 KV heads × 128, bf16) on 8 H200 in one CP group. " +
			"Prefill: 2 FLOP per parameter per token at 40% of the H200's 989 TFLOPS dense bf16 (NVIDIA H200 datasheet) " +
			"on 8 GPUs = 5.1 µs/token; attention: 4 × 32 layers × 4096 FLOP per token pair at the same rate = 0.166 ns. " +
			"Decode: the 16 GB of weights read at the H200's 4.8 TB/s HBM3e per step = 3.3 ms, plus a 7 K-token context's " +
			"KV (0.9 GB) over 8 ranks per request = 24 µs. L2↔L1: pinned host↔device copies measured on this project's " +
			"H200 by gpu-bundle/run.sh (about 55 GB/s each way). KV per rank per token: 32 × 2 × 8 × 128 × 2 B = 128 KiB " +
			"(a CP rank holds the whole KV of the pages it owns). Storage: a local NVMe SSD, 100 µs per request and 3 GB/s.",
		PrefillNsPerToken: 5060, AttentionNsPerTokenPair: 0.166,
		DecodeStepNs: 3.3e6, DecodeNsPerRequest: 24e3,
		H2DGBps: 55, D2HGBps: 55,
		StorageLatencyUs: 100, StorageGBps: 3,
		KVBytesPerToken: 131072,
	},
	"unit": {
		Name:   "unit",
		Source: "round numbers for tests and examples, not a measured system",
		// 1 µs per computed token, 1 ms per decode step, 10 µs per running request.
		PrefillNsPerToken: 1000, DecodeStepNs: 1e6, DecodeNsPerRequest: 1e4,
		H2DGBps: 10, D2HGBps: 10, StorageLatencyUs: 1000, StorageGBps: 1,
	},
}

// CostProfiles are the names of the built-in profiles, sorted.
func CostProfiles() []string { return slices.Sorted(maps.Keys(builtinProfiles)) }

// LoadCostProfile returns the built-in profile called nameOrPath, or reads a profile from
// the JSON file at that path (fields it leaves out are 0), then applies overrides: a
// comma-separated list of json_field=value (e.g. "prefill_ns_per_token=3000,h2d_gbps=25").
// Errors wrap ErrBadInput and name the bad value.
func LoadCostProfile(nameOrPath, overrides string) (CostProfile, error) {
	if nameOrPath == "" {
		nameOrPath = DefaultCostProfile
	}
	p, ok := builtinProfiles[nameOrPath]
	if !ok {
		b, err := readRegularFile(nameOrPath)
		if err != nil {
			return p, bad("cost profile %q is neither a built-in profile (%s) nor a readable file: %v",
				nameOrPath, strings.Join(CostProfiles(), ", "), err)
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return p, bad("cost profile %s: %v", nameOrPath, err)
		}
		if p.Name == "" {
			p.Name = nameOrPath
		}
	}
	if err := p.override(overrides); err != nil {
		return p, err
	}
	return p, p.validate()
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
		if tag != "name" && tag != "source" {
			fields[tag] = v.Field(i)
		}
	}
	for _, kv := range strings.Split(list, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, known := fields[k]
		if !ok || !known {
			return bad("--cost %q: want field=value with field one of %s", kv, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		}
		x, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return bad("--cost %s: value %q is not a number", k, val)
		}
		if f.Kind() == reflect.Int {
			if x != math.Trunc(x) || math.Abs(x) > 1<<53 { // int(x) of a larger x is undefined
				return bad("--cost %s: value %q is not a whole number (of at most 2^53)", k, val)
			}
			f.SetInt(int64(x))
		} else {
			f.SetFloat(x)
		}
	}
	p.Name += "+" + list
	return nil
}

// validate rejects figures that are not finite numbers (NaN or infinite: the report could
// not even be written), negative figures, bandwidths that are not positive and a KV size
// per token over the run's limit.
func (p *CostProfile) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"prefill_ns_per_token", p.PrefillNsPerToken}, {"attention_ns_per_token_pair", p.AttentionNsPerTokenPair},
		{"decode_step_ns", p.DecodeStepNs}, {"decode_ns_per_request", p.DecodeNsPerRequest},
		{"storage_latency_us", p.StorageLatencyUs}, {"h2d_gbps", p.H2DGBps}, {"d2h_gbps", p.D2HGBps},
		{"storage_gbps", p.StorageGBps}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return bad("cost profile %s: %s %g is not a finite number", p.Name, f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"prefill_ns_per_token", p.PrefillNsPerToken}, {"attention_ns_per_token_pair", p.AttentionNsPerTokenPair},
		{"decode_step_ns", p.DecodeStepNs}, {"decode_ns_per_request", p.DecodeNsPerRequest},
		{"storage_latency_us", p.StorageLatencyUs}, {"kv_bytes_per_token", float64(p.KVBytesPerToken)}} {
		if f.v < 0 {
			return bad("cost profile %s: %s %g is negative", p.Name, f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"h2d_gbps", p.H2DGBps}, {"d2h_gbps", p.D2HGBps}, {"storage_gbps", p.StorageGBps}} {
		if f.v <= 0 {
			return bad("cost profile %s: %s %g must be positive", p.Name, f.name, f.v)
		}
	}
	if p.KVBytesPerToken > MaxKVBytesPerToken {
		return bad("cost profile %s: kv_bytes_per_token %d is over the limit of %d", p.Name, p.KVBytesPerToken, MaxKVBytesPerToken)
	}
	return nil
}

// prefillNs is the compute time of a prefill of n prompt tokens whose first h were hits.
func (p *CostProfile) prefillNs(n, h int) float64 {
	c, nn, hh := float64(n-h), float64(n), float64(h)
	return p.PrefillNsPerToken*c + p.AttentionNsPerTokenPair*(nn*nn-hh*hh)/2
}

// decodeNs is the time of a decode step of running requests.
func (p *CostProfile) decodeNs(running int) float64 {
	if running == 0 {
		return 0
	}
	return p.DecodeStepNs + p.DecodeNsPerRequest*float64(running)
}

// copyNs is the time to move bytes at gbps GB/s.
func copyNs(bytes int64, gbps float64) float64 { return float64(bytes) / gbps }

// storageNs is the time a prefetch of bytes takes.
func (p *CostProfile) storageNs(bytes int64) float64 {
	return p.StorageLatencyUs*1e3 + copyNs(bytes, p.StorageGBps)
}

// String is the profile's name and figures, for the report.
func (p *CostProfile) String() string {
	return fmt.Sprintf("%s (prefill %.0f ns/token, decode %.2f ms/step + %.0f µs/request, H2D %g GB/s, D2H %g GB/s, storage %g µs + %g GB/s)",
		p.Name, p.PrefillNsPerToken, p.DecodeStepNs/1e6, p.DecodeNsPerRequest/1e3, p.H2DGBps, p.D2HGBps, p.StorageLatencyUs, p.StorageGBps)
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
