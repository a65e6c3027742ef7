package slab

import (
	"encoding/json"
	"fmt"
	"strings"
)

// offer is what each rank contributes to the exchange: its spec, and the handle of the slab
// it created or why it could not.
type offer struct {
	Version int    `json:"v"`
	Spec    shared `json:"spec"`
	Handle  []byte `json:"handle,omitempty"`
	Err     string `json:"err,omitempty"`
}

const wireVersion = 1

// verdict decides, from every rank's offer, whether the set can be opened. It is a pure
// function of the gathered bytes, so every rank computes the same error, naming the ranks at
// fault (group rank and global rank).
func verdict(groupName string, globalRanks []int, raw [][]byte) ([]offer, error) {
	name := func(r int) string { return rankName(globalRanks, r) }
	offers := make([]offer, len(raw))
	var bad []string
	for r, b := range raw {
		if err := json.Unmarshal(b, &offers[r]); err != nil || offers[r].Version != wireVersion {
			bad = append(bad, fmt.Sprintf("%s sent an unreadable offer (%d bytes)", name(r), len(b)))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: slab set on group %s: %s", ErrBadArgument, groupName, strings.Join(bad, "; "))
	}
	// The majority spec; ties go to the spec of the lowest rank.
	count := map[shared]int{}
	for _, o := range offers {
		count[o.Spec]++
	}
	ref := offers[0].Spec
	for _, o := range offers {
		if count[o.Spec] > count[ref] {
			ref = o.Spec
		}
	}
	for r, o := range offers {
		if o.Spec != ref {
			bad = append(bad, fmt.Sprintf("%s has %s", name(r), o.Spec.diff(ref)))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w on group %s: %s", ErrSpecMismatch, groupName, strings.Join(bad, "; "))
	}
	for r, o := range offers {
		if o.Err != "" {
			bad = append(bad, fmt.Sprintf("%s could not create its slab: %s", name(r), o.Err))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w on group %s: %s", ErrSetup, groupName, strings.Join(bad, "; "))
	}
	return offers, nil
}

// rankName names group rank r and, when known, its global rank.
func rankName(globalRanks []int, r int) string {
	if r < len(globalRanks) {
		return fmt.Sprintf("rank %d (global %d)", r, globalRanks[r])
	}
	return fmt.Sprintf("rank %d", r)
}

// mapVerdict decides from every rank's mapping status (empty = mapped every slab).
func mapVerdict(groupName string, globalRanks []int, statuses [][]byte) error {
	var bad []string
	for r, s := range statuses {
		if len(s) > 0 {
			bad = append(bad, fmt.Sprintf("%s could not map: %s", rankName(globalRanks, r), s))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w on group %s: %s", ErrSetup, groupName, strings.Join(bad, "; "))
	}
	return nil
}
