package runner

import (
	"math"

	"github.com/cpcache/cpcache/workload"
)

// Time modes (Config.Time.Mode).
const (
	// TimeVirtual replays the workload's arrival times on a simulated clock: a request
	// is admitted only once the clock reached its arrival (scaled by Speed).
	TimeVirtual = "virtual"
	// TimeNone serves requests back to back in workload order, every one arrived at 0; the
	// clock still measures the modelled time of every step.
	TimeNone = "none"
)

// TimeConfig is how a run models time.
type TimeConfig struct {
	Mode  string      // TimeVirtual or TimeNone; "" is TimeVirtual for traces, TimeNone for synthetic
	Speed float64     // arrival times are divided by Speed (0: 1)
	Cost  CostProfile // step costs (a zero profile: DefaultCostProfile)
	// Model is Cost resolved against the run's layout, page size and KV size (Prepare).
	Model CostModel
	// PrefetchSync is the scheduler before prefetch overlapped decode: it waits for a
	// storage prefetch in steps where running requests decode nothing (for comparison).
	PrefetchSync bool
}

// normalize fills in the defaults for a workload kind and validates; errors wrap
// ErrBadInput.
func (t *TimeConfig) normalize(workloadKind string, spread bool) error {
	switch t.Mode {
	case "":
		t.Mode = TimeNone
		if workloadKind == WorkloadTrace || spread {
			t.Mode = TimeVirtual
		}
	case TimeVirtual, TimeNone:
	default:
		return bad("time %q (want %s or %s)", t.Mode, TimeVirtual, TimeNone)
	}
	if t.Speed == 0 {
		t.Speed = 1
	}
	if t.Speed < 0 || math.IsNaN(t.Speed) || math.IsInf(t.Speed, 0) {
		return bad("speed %g must be a positive number", t.Speed)
	}
	if t.Cost.Name == "" {
		c, err := LoadCostProfile(DefaultCostProfile, "")
		if err != nil {
			return err
		}
		t.Cost = c
	}
	return t.Cost.validate()
}

// requestTiming is when one request was served, in virtual nanoseconds, and what it hit.
type requestTiming struct {
	ID        int32 `json:"id"` // the request's position in the workload (workload.Request.ID)
	ArrivalNs int64 `json:"a"`
	QueueNs   int64 `json:"q"` // arrival to the start of its prefill step
	TTFTNs    int64 `json:"t"` // arrival to the end of its prefill step (the first token)
	Prompt    int32 `json:"n"`
	HitL1     int32 `json:"h1"`
	HitL2     int32 `json:"h2"`
	HitL3     int32 `json:"h3"`
}

// vclock is a replica's virtual clock: every rank of the replica keeps the same one (it
// advances only from replicated decisions), so admitting by arrival time keeps the ranks
// in lockstep.
type vclock struct {
	cost    *CostModel
	virtual bool
	speed   float64

	nowNs     float64 // the clock
	stepStart float64 // the clock when the current step began

	// The current step's work, charged by endStep.
	prefillNs   float64
	loadPages   int // pages loaded back L2→L1 (all ranks)
	backupPages int // pages backed up L1→L2 (all ranks)
	decoding    int // requests that decode a token
	admitted    []requestTiming

	computed     int64           // prompt tokens computed, over the run
	timings      []requestTiming // every admitted request, in admission order
	firstArrival float64         // NaN until the first admission
}

func newVClock(cfg *Config) *vclock {
	return &vclock{cost: &cfg.Time.Model, virtual: cfg.Time.Mode == TimeVirtual, speed: cfg.Time.Speed, firstArrival: math.NaN()}
}

// arrival is when r arrives on the clock.
func (v *vclock) arrival(r workload.Request) float64 {
	if !v.virtual {
		return 0
	}
	return float64(r.ArrivalMs) * 1e6 / v.speed
}

func (v *vclock) arrived(r workload.Request) bool { return v.arrival(r) <= v.nowNs }

// advanceTo moves the clock forward to t (an idle wait: nothing runs until then).
func (v *vclock) advanceTo(t float64) {
	if t > v.nowNs {
		v.nowNs = t
	}
}

// beginStep marks the start of a scheduler step.
func (v *vclock) beginStep() { v.stepStart = v.nowNs }

// prefilled records a request admitted in this step: n prompt tokens of which hit were
// served from the cache (by tier).
func (v *vclock) prefilled(r workload.Request, l1, l2, l3 int64) {
	n := len(r.Tokens)
	hit := int(l1 + l2 + l3)
	v.prefillNs += v.cost.prefillNs(n, hit)
	v.computed += int64(n - hit)
	a := v.arrival(r)
	if math.IsNaN(v.firstArrival) {
		v.firstArrival = a
	}
	v.admitted = append(v.admitted, requestTiming{ID: int32(r.ID), ArrivalNs: int64(a), QueueNs: int64(v.stepStart - a), Prompt: int32(n),
		HitL1: int32(l1), HitL2: int32(l2), HitL3: int32(l3)})
}

// perRankBytes is what one rank moves for pages of the sequence (each rank its own: page i
// belongs to CP rank i mod cp).
func (v *vclock) perRankBytes(pages int) int64 {
	return int64(v.cost.perRankPages(pages)) * v.cost.pageBytes()
}

// storageReady is when a prefetch of pages asked at asked is read (every I/O rank reading
// its own pages at once).
func (v *vclock) storageReady(asked float64, pages int) float64 {
	return asked + v.cost.storageNs(pages)
}

// endStep advances the clock by the step's modelled duration and stamps the first token of
// the requests admitted in it.
func (v *vclock) endStep() {
	busy := v.prefillNs + v.cost.decodeNs(v.decoding) + copyNs(v.perRankBytes(v.loadPages), v.cost.H2DGBps)
	d := max(busy, copyNs(v.perRankBytes(v.backupPages), v.cost.D2HGBps))
	v.nowNs += d
	for _, t := range v.admitted {
		t.TTFTNs = int64(v.nowNs) - t.ArrivalNs
		v.timings = append(v.timings, t)
	}
	v.admitted = v.admitted[:0]
	v.prefillNs, v.loadPages, v.backupPages, v.decoding = 0, 0, 0, 0
}

// makespanNs is the virtual time from the first arrival to now.
func (v *vclock) makespanNs() float64 {
	if math.IsNaN(v.firstArrival) {
		return 0
	}
	return v.nowNs - v.firstArrival
}
