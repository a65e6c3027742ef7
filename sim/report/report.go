package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/cpcache/cpcache/sim/vtime"
)

// Report is what a run measured, summed over every rank (rank 0 prints it).
type Report struct {
	Version          string `json:"version"` // cpcache's version (internal/version), "0.1.0"
	Layout           string `json:"layout"`
	ConsensusBackend string `json:"consensus_backend"`
	Workload         string `json:"workload"`
	// KVLayout is the run's KV layout (cpcache run --model); nil when pages are opaque.
	KVLayout *KVLayout `json:"kv_layout,omitempty"`
	// L2 is what the job's L2 slabs take (zero when the producer does not say).
	L2 L2Memory `json:"l2"`

	Requests     int64   `json:"requests"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	TokensHitL1  int64   `json:"tokens_hit_l1"`
	TokensHitL2  int64   `json:"tokens_hit_l2"`
	TokensHitL3  int64   `json:"tokens_hit_storage"`
	TokensMissed int64   `json:"tokens_missed"`
	HitRate      float64 `json:"hit_rate"` // (L1+L2+L3 hits) / input tokens

	PagesWrittenL2 int64 `json:"pages_written_l2"`
	PagesLoadedL2  int64 `json:"pages_loaded_l2"`
	BytesMoved     int64 `json:"bytes_moved"`

	SchedulerSteps     int64   `json:"scheduler_steps"`
	ConsensusSteps     int64   `json:"consensus_steps"`
	CollectivesPerStep float64 `json:"collectives_per_step"` // consensus collectives / scheduler steps, per rank; must be 1
	ConsensusMedianUs  float64 `json:"consensus_latency_median_us"`
	ConsensusP99Us     float64 `json:"consensus_latency_p99_us"`
	DigestChecks       int64   `json:"digest_checks"`
	DigestMismatches   int64   `json:"digest_mismatches"`
	// Divergences (quarantines entered), Recoveries (agreed recovery flushes) and
	// QuarantinedSteps, summed over replicas; Flushes and FlushesRefused by --fault flush.
	Divergences      int64 `json:"divergences"`
	Recoveries       int64 `json:"recoveries"`
	QuarantinedSteps int64 `json:"quarantined_steps"`
	CopyFailures     int64 `json:"copy_failures"` // backups aborted and loads made stale, on every rank of a replica
	Flushes          int64 `json:"flushes"`
	FlushesRefused   int64 `json:"flushes_refused"`

	PagesVerified int64 `json:"pages_verified"`
	BadPages      int64 `json:"bad_pages"`
	// Model is set by a run whose compute the reference model does (--engine model).
	Model *ModelCheck `json:"model,omitempty"`

	// L3 storage (with --storage): its URL, prompt tokens served from pages prefetched from
	// it (TokensHitL3), pages the replicas inserted from it and backed up to it (agreed
	// counts, summed over replicas), and failed storage calls (summed over ranks: each rank
	// reads and writes the pages it owns with its own handle; each
	// a miss or a skipped backup), stored values that failed verification (each a miss,
	// deleted so that the next backup replaces it) and, of them, those that failed
	// authentication (forged, replayed under another key, or written with another MAC key).
	// The URL is shown without its password.
	Storage         string `json:"storage,omitempty"`
	PagesPrefetched int64  `json:"pages_prefetched"`
	PagesBackedUp   int64  `json:"pages_backed_up"`
	StorageErrors   int64  `json:"storage_errors"`
	StorageRejected int64  `json:"storage_rejected"`
	StorageForged   int64  `json:"storage_forged"`
	// StoragePagesRead and StoragePagesWritten: pages read from and written to storage,
	// summed over ranks (each rank's own pages; a CP group's traffic is spread over its ranks).
	StoragePagesRead    int64 `json:"storage_pages_read"`
	StoragePagesWritten int64 `json:"storage_pages_written"`
	PrefetchSteps       int64 `json:"prefetch_steps"` // scheduler steps spent waiting for prefetches (in SchedulerSteps)
	// With prefetches overlapping decode (summed over replicas):
	// prefetches asked again after the cache refused stored pages for want of room or quota
	// (or a changed tree, a duplicate read) or after they were lost before the prefill,
	// stored pages still refused after the last try or lost while storage could not be
	// asked (computed), and stored pages a read did not bring (cut by the PrefetchTimeout
	// timer, revoked, or short: a storage error or a rejected page).
	PrefetchRetries      int64 `json:"prefetch_retries"`
	PrefetchRefusedPages int64 `json:"prefetch_refused_pages"`
	// PrefetchRefusedBy breaks PrefetchRefusedPages down by cause.
	PrefetchRefusedBy RefusedPages `json:"prefetch_refused_by_cause"`
	PrefetchCutPages  int64        `json:"prefetch_cut_pages"`
	// PrefetchCostSkippedPages: stored pages not read because the cost model computes them
	// faster than storage reads them (agreed, summed over replicas; see Latency.BreakEven).
	PrefetchCostSkippedPages int64 `json:"prefetch_cost_skipped_pages"`
	// StorageCircuitOpenSeconds: the longest time any rank's storage circuit breaker
	// was open (storage unanswered; the group served from L1 and L2 meanwhile).
	StorageCircuitOpenSeconds float64 `json:"storage_circuit_open_seconds"`
	// StorageAbandoned: storage operations (summed over ranks) whose call stopped waiting at
	// its deadline because the kernel did not return (a frozen or hung file system under a
	// file:// store): the call failed, the job went on.
	StorageAbandoned int64 `json:"storage_abandoned"`
	// StorageEvicted, StorageExpired: values (summed over ranks) that a file:// store removed
	// to stay within its max_bytes, and because they were unused past its ttl.
	StorageEvicted int64 `json:"storage_evicted"`
	StorageExpired int64 `json:"storage_expired"`

	// Device is the memory and copy bandwidth of a --device cuda run (nil for host runs).
	Device *DeviceReport `json:"device,omitempty"`

	WallSeconds float64 `json:"wall_seconds"`

	// Virtual time, latency and misses (see sim/vtime and the scheduler's miss attribution).
	Latency            *LatencyReport  `json:"latency,omitempty"`
	MissCauses         MissCauses      `json:"miss_causes"`
	Timeline           []TimelinePoint `json:"hit_rate_timeline,omitempty"`
	ConsensusHistogram []HistogramBin  `json:"consensus_latency_histogram,omitempty"`
	Reference          Reference       `json:"reference"`
}

// KVLayout is the KV layout of a run: as given (a preset's name or the textual form), in
// full, and what it takes on one rank.
type KVLayout struct {
	Name          string `json:"name"`                // as --model gave it
	Spec          string `json:"spec"`                // the textual form (kvlayout.Layout.String)
	BytesPerToken int64  `json:"bytes_per_token"`     // one rank's bytes of one token, all layers and parts
	PageBytes     int64  `json:"page_bytes"`          // one rank's bytes of one page
	Layers        int    `json:"layers,omitempty"`    // model layers
	Parts         int    `json:"parts,omitempty"`     // parts of each layer (K and V, a latent, side buffers)
	L2Layout      string `json:"l2_layout,omitempty"` // page_first or layer_first
	L1            string `json:"l1,omitempty"`        // what the L1 is: host or device, per-layer buffers or one pool
	// LayerWaits are the layer-wise waits of load-backs over every rank (WaitL1Layer: each
	// layer's chunks checked once that layer landed); 0 when load-backs are waited for whole.
	LayerWaits int64 `json:"layer_waits,omitempty"`
}

// L2Memory is what a job's L2 takes: with shared slabs (an MLA layout at attention-TP > 1)
// one copy of each page per CP group, else one per attention-TP rank.
type L2Memory struct {
	Shared       bool  `json:"shared"`         // the attention-TP ranks of a CP index share one slab
	Copies       int   `json:"copies"`         // L2 copies of each sequence page
	BytesPerPage int64 `json:"bytes_per_page"` // L2 bytes holding one sequence page, every copy
	Slabs        int   `json:"slabs"`          // slabs of the whole job
	Bytes        int64 `json:"bytes"`          // L2 bytes of the whole job (every slab)
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r for a person.
func (r *Report) WriteText(w io.Writer) {
	if r.Version != "" {
		fmt.Fprintf(w, "cpcache run report (cpcache %s)\n", r.Version)
	} else {
		fmt.Fprintf(w, "cpcache run report\n")
	}
	fmt.Fprintf(w, "  layout               %s (consensus: %s)\n", r.Layout, r.ConsensusBackend)
	if kv := r.KVLayout; kv != nil {
		fmt.Fprintf(w, "  kv layout            %s (%d B/token per rank, %d B/page)\n", kv.Name, kv.BytesPerToken, kv.PageBytes)
		if kv.L1 != "" {
			fmt.Fprintf(w, "  kv memory            L1 %s; L2 %s; %d layers × %d parts = %d chunks of a page\n",
				kv.L1, kv.L2Layout, kv.Layers, kv.Parts, kv.Layers*kv.Parts)
			then := "each layer checked as it landed"
			if r.Model != nil {
				then = "the model reading each layer once it landed"
			}
			fmt.Fprintf(w, "  layer-wise waits     %d (load-backs waited for layer by layer, %s)\n", kv.LayerWaits, then)
		}
	}
	if m := r.L2; m.Slabs > 0 {
		how := "one slab per rank"
		if m.Shared {
			how = "attention-TP ranks share a slab"
		}
		fmt.Fprintf(w, "  L2 memory            %d B per page (copies: %d), %d B in all (slabs: %d, %s)\n", m.BytesPerPage, m.Copies, m.Bytes, m.Slabs, how)
	}
	fmt.Fprintf(w, "  workload             %s\n", r.Workload)
	fmt.Fprintf(w, "  requests             %d (%d input tokens, %d output tokens)\n", r.Requests, r.InputTokens, r.OutputTokens)
	fmt.Fprintf(w, "  tokens hit in L1     %d (%s)\n", r.TokensHitL1, r.pct(r.TokensHitL1))
	fmt.Fprintf(w, "  tokens hit in L2     %d (%s)\n", r.TokensHitL2, r.pct(r.TokensHitL2))
	if r.Storage != "" {
		fmt.Fprintf(w, "  tokens hit in storage %d (%s)\n", r.TokensHitL3, r.pct(r.TokensHitL3))
	}
	fmt.Fprintf(w, "  tokens missed        %d (%s)\n", r.TokensMissed, r.pct(r.TokensMissed))
	fmt.Fprintf(w, "  hit rate             %.1f%%\n", 100*r.HitRate)
	fmt.Fprintf(w, "  L2 pages written     %d\n", r.PagesWrittenL2)
	fmt.Fprintf(w, "  L2 pages loaded      %d\n", r.PagesLoadedL2)
	fmt.Fprintf(w, "  bytes moved          %s\n", vtime.HumanBytes(r.BytesMoved))
	if r.Storage != "" {
		fmt.Fprintf(w, "  storage              %s\n", r.Storage)
		fmt.Fprintf(w, "  storage pages        %d prefetched, %d backed up, %d errors, %d rejected (%d forged)\n",
			r.PagesPrefetched, r.PagesBackedUp, r.StorageErrors, r.StorageRejected, r.StorageForged)
		fmt.Fprintf(w, "  storage I/O          %d pages read, %d written (summed over ranks, each its own pages)\n", r.StoragePagesRead, r.StoragePagesWritten)
		fmt.Fprintf(w, "  prefetches           %d retried, %d stored pages refused, %d cut, %d skipped for cost\n", r.PrefetchRetries, r.PrefetchRefusedPages, r.PrefetchCutPages, r.PrefetchCostSkippedPages)
		b := &r.PrefetchRefusedBy
		fmt.Fprintf(w, "  refused by cause     no L2 room %d, quota %d, tree changed %d, duplicate %d, lost before prefill %d, storage not asked %d\n",
			b.NoRoom, b.Quota, b.TreeChanged, b.Duplicate, b.Lost, b.NotAsked)
		fmt.Fprintf(w, "  storage circuit      open %.1f s, %d operations abandoned in the kernel\n", r.StorageCircuitOpenSeconds, r.StorageAbandoned)
		if r.StorageEvicted+r.StorageExpired > 0 {
			fmt.Fprintf(w, "  storage evictions    %d for the capacity, %d past the TTL\n", r.StorageEvicted, r.StorageExpired)
		}
	}
	fmt.Fprintf(w, "  scheduler steps      %d (%.2f consensus collectives per step)\n", r.SchedulerSteps, r.CollectivesPerStep)
	if r.PrefetchSteps > 0 {
		fmt.Fprintf(w, "  prefetch wait steps  %d (included above)\n", r.PrefetchSteps)
	}
	fmt.Fprintf(w, "  consensus latency    median %.1f µs, p99 %.1f µs\n", r.ConsensusMedianUs, r.ConsensusP99Us)
	fmt.Fprintf(w, "  digest checks        %d, mismatches %d\n", r.DigestChecks, r.DigestMismatches)
	fmt.Fprintf(w, "  divergences          %d, recoveries %d, quarantined steps %d\n", r.Divergences, r.Recoveries, r.QuarantinedSteps)
	if r.CopyFailures > 0 {
		fmt.Fprintf(w, "  copy failures        %d (backups aborted or loads made stale on every rank)\n", r.CopyFailures)
	}
	if r.Flushes+r.FlushesRefused > 0 {
		fmt.Fprintf(w, "  flushes              %d, refused while busy %d\n", r.Flushes, r.FlushesRefused)
	}
	fmt.Fprintf(w, "  pages verified       %d, bad pages %d\n", r.PagesVerified, r.BadPages)
	r.Model.writeText(w)
	r.writeTimeText(w)
	r.Device.writeText(w)
	fmt.Fprintf(w, "  wall time            %.1f s\n", r.WallSeconds)
}

// pct formats n as a share of the input tokens ("-" without input).
func (r *Report) pct(n int64) string {
	if r.InputTokens == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(r.InputTokens))
}

// Quantile returns the q-quantile (0..1) of sorted samples by nearest rank; 0 for none.
func Quantile[T any](s []T, q float64) T {
	if len(s) == 0 {
		var zero T
		return zero
	}
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// ModelCheck is what the reference model (sim/refmodel) computed in a run and how its
// outputs compared with the cache-off run: every request's generated tokens and the hash of
// its final logits, computed with the cache (the cached prefix read from L1) and without it
// (the same request from its first token). Requests are counted once per replica; tokens and
// seconds are summed over ranks (every rank computes every token: its own pages' attention,
// the rest redundantly).
type ModelCheck struct {
	Variant          string  `json:"variant"`
	OutputsChecked   int64   `json:"outputs_checked"`
	OutputsDiffering int64   `json:"outputs_differing"`
	Tokens           int64   `json:"tokens_computed"`           // with the cache, summed over ranks
	Seconds          float64 `json:"seconds"`                   // their wall time, layer waits included
	RefTokens        int64   `json:"reference_tokens_computed"` // by the cache-off reference
	RefSeconds       float64 `json:"reference_seconds"`
}

func (m *ModelCheck) writeText(w io.Writer) {
	if m == nil {
		return
	}
	fmt.Fprintf(w, "  reference model      %s: outputs checked %d, differing %d\n", m.Variant, m.OutputsChecked, m.OutputsDiffering)
	rate := func(tok int64, s float64) float64 {
		if s <= 0 {
			return 0
		}
		return float64(tok) / s
	}
	fmt.Fprintf(w, "  model compute        %d tokens with the cache (%.0f tokens/s per rank), %d without (%.0f tokens/s per rank)\n",
		m.Tokens, rate(m.Tokens, m.Seconds), m.RefTokens, rate(m.RefTokens, m.RefSeconds))
}

// RefusedPages breaks the stored pages a run computed instead of reading (prefetch_refused_pages)
// down by why, after the scheduler's last try: the cause of the cache's last refusal
// (hicache.PrefetchRefusal: no L2 room, the prefetch quota, a tree changed since the query, a
// duplicate read of the same continuation), pages read but lost before the prefill (evicted
// while the request did not hold them), and pages storage could not be asked for again (its
// circuit open, or the group in quarantine).
type RefusedPages struct {
	NoRoom      int64 `json:"no_l2_room"`
	Quota       int64 `json:"quota"`
	TreeChanged int64 `json:"tree_changed"`
	Duplicate   int64 `json:"duplicate"`
	Lost        int64 `json:"lost"`
	NotAsked    int64 `json:"not_asked"`
}

// Add adds o's counts to r.
func (r *RefusedPages) Add(o RefusedPages) {
	r.NoRoom += o.NoRoom
	r.Quota += o.Quota
	r.TreeChanged += o.TreeChanged
	r.Duplicate += o.Duplicate
	r.Lost += o.Lost
	r.NotAsked += o.NotAsked
}
