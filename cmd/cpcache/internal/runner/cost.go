package runner

import "github.com/cpcache/cpcache/sim/vtime"

// DefaultCostProfile is the profile `cpcache run` uses without --cost-profile.
const DefaultCostProfile = vtime.DefaultCostProfile

// CostProfiles are the names of the built-in profiles, sorted.
func CostProfiles() []string { return vtime.CostProfiles() }

// LoadCostProfile is vtime.LoadCostProfile; its errors wrap ErrBadInput.
func LoadCostProfile(nameOrPath, overrides string) (vtime.CostProfile, error) {
	p, err := vtime.LoadCostProfile(nameOrPath, overrides)
	if err != nil {
		return p, bad("%w", err)
	}
	return p, nil
}
