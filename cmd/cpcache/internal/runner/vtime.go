package runner

import (
	"math"

	"github.com/cpcache/cpcache/sim/vtime"
)

// Time modes (Config.Time.Mode): see vtime.Virtual and vtime.None.
const (
	TimeVirtual = vtime.Virtual
	TimeNone    = vtime.None
)

// TimeConfig is how a run models time.
type TimeConfig struct {
	Mode  string            // TimeVirtual or TimeNone; "" is TimeVirtual for traces, TimeNone for synthetic
	Speed float64           // arrival times are divided by Speed (0: 1)
	Cost  vtime.CostProfile // step costs (a zero profile: DefaultCostProfile)
	// Model is Cost resolved against the run's layout, page size and KV size (Prepare).
	Model vtime.CostModel
	// PrefetchSync makes a storage prefetch wait in steps where running requests decode
	// nothing, instead of overlapping decode (for comparison).
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
	if err := t.Cost.Validate(); err != nil {
		return bad("%w", err)
	}
	return nil
}

// newClock is the virtual clock of a replica of cfg's run.
func newClock(cfg *Config) *vtime.Clock {
	return vtime.NewClock(&cfg.Time.Model, cfg.Time.Mode, cfg.Time.Speed)
}
