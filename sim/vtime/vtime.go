package vtime

import (
	"math"

	"github.com/cpcache/cpcache/workload"
)

// Time modes.
const (
	// Virtual replays the workload's arrival times on the clock: a request is admitted only
	// once the clock reached its arrival (scaled by the speed).
	Virtual = "virtual"
	// None serves requests back to back in workload order, every one arrived at 0; the
	// clock still measures the modelled time of every step.
	None = "none"
)

// RequestTiming is when one request was served, in virtual nanoseconds, and what it hit.
type RequestTiming struct {
	ID        int32 `json:"id"` // the request's position in the workload (workload.Request.ID)
	ArrivalNs int64 `json:"a"`
	QueueNs   int64 `json:"q"` // arrival to the start of its prefill step
	TTFTNs    int64 `json:"t"` // arrival to the end of its prefill step (the first token)
	Prompt    int32 `json:"n"`
	HitL1     int32 `json:"h1"`
	HitL2     int32 `json:"h2"`
	HitL3     int32 `json:"h3"`
}

// Clock is a replica's virtual clock: every rank of the replica keeps the same one (it
// advances only from replicated decisions), so admitting by arrival time keeps the ranks
// in lockstep.
type Clock struct {
	cost    *CostModel
	virtual bool
	speed   float64

	nowNs     float64 // the clock
	stepStart float64 // the clock when the current step began

	// The current step's work, charged by EndStep.
	prefillNs   float64
	loadPages   int // pages loaded back L2→L1 (all ranks)
	backupPages int // pages backed up L1→L2 (all ranks)
	decoding    int // requests that decode a token
	admitted    []RequestTiming

	computed     int64           // prompt tokens computed, over the run
	timings      []RequestTiming // every admitted request, in admission order
	firstArrival float64         // NaN until the first admission
}

// NewClock returns a clock at 0 that charges steps by cost; in mode Virtual it admits a
// request at its arrival divided by speed, in mode None at 0.
func NewClock(cost *CostModel, mode string, speed float64) *Clock {
	return &Clock{cost: cost, virtual: mode == Virtual, speed: speed, firstArrival: math.NaN()}
}

// Virtual reports whether the clock replays arrival times.
func (v *Clock) Virtual() bool { return v.virtual }

// NowNs is the clock, in virtual nanoseconds.
func (v *Clock) NowNs() float64 { return v.nowNs }

// Arrival is when r arrives on the clock.
func (v *Clock) Arrival(r workload.Request) float64 {
	if !v.virtual {
		return 0
	}
	return float64(r.ArrivalMs) * 1e6 / v.speed
}

// Arrived reports whether r has arrived.
func (v *Clock) Arrived(r workload.Request) bool { return v.Arrival(r) <= v.nowNs }

// AdvanceTo moves the clock forward to t (an idle wait: nothing runs until then).
func (v *Clock) AdvanceTo(t float64) {
	if t > v.nowNs {
		v.nowNs = t
	}
}

// BeginStep marks the start of a scheduler step.
func (v *Clock) BeginStep() { v.stepStart = v.nowNs }

// Prefilled records a request admitted in this step: n prompt tokens of which hit were
// served from the cache (by tier).
func (v *Clock) Prefilled(r workload.Request, l1, l2, l3 int64) {
	n := len(r.Tokens)
	hit := int(l1 + l2 + l3)
	v.prefillNs += v.cost.PrefillNs(n, hit)
	v.computed += int64(n - hit)
	a := v.Arrival(r)
	if math.IsNaN(v.firstArrival) {
		v.firstArrival = a
	}
	v.admitted = append(v.admitted, RequestTiming{ID: int32(r.ID), ArrivalNs: int64(a), QueueNs: int64(v.stepStart - a), Prompt: int32(n),
		HitL1: int32(l1), HitL2: int32(l2), HitL3: int32(l3)})
}

// Decoded records a request that decodes a token in this step.
func (v *Clock) Decoded() { v.decoding++ }

// Loaded records pages loaded back L2→L1 in this step (all ranks).
func (v *Clock) Loaded(pages int) { v.loadPages += pages }

// BackedUp records pages backed up L1→L2 in this step (all ranks).
func (v *Clock) BackedUp(pages int) { v.backupPages += pages }

// perRankBytes is what one rank moves for pages of the sequence (each rank its own: page i
// belongs to CP rank i mod cp).
func (v *Clock) perRankBytes(pages int) int64 {
	return int64(v.cost.PerRankPages(pages)) * v.cost.PageBytes()
}

// StorageReady is when a prefetch of pages asked at asked is read (every I/O rank reading
// its own pages at once).
func (v *Clock) StorageReady(asked float64, pages int) float64 {
	return asked + v.cost.StorageNs(pages)
}

// EndStep advances the clock by the step's modelled duration and stamps the first token of
// the requests admitted in it.
func (v *Clock) EndStep() {
	busy := v.cost.LoadComputeNs(v.prefillNs+v.cost.DecodeNs(v.decoding), CopyNs(v.perRankBytes(v.loadPages), v.cost.H2DGBps))
	d := max(busy, CopyNs(v.perRankBytes(v.backupPages), v.cost.D2HGBps))
	v.nowNs += d
	for _, t := range v.admitted {
		t.TTFTNs = int64(v.nowNs) - t.ArrivalNs
		v.timings = append(v.timings, t)
	}
	v.admitted = v.admitted[:0]
	v.prefillNs, v.loadPages, v.backupPages, v.decoding = 0, 0, 0, 0
}

// MakespanNs is the virtual time from the first arrival to now.
func (v *Clock) MakespanNs() float64 {
	if math.IsNaN(v.firstArrival) {
		return 0
	}
	return v.nowNs - v.firstArrival
}

// Computed is the prompt tokens computed so far.
func (v *Clock) Computed() int64 { return v.computed }

// Timings are the requests admitted in the steps that ended, in admission order.
func (v *Clock) Timings() []RequestTiming { return v.timings }
