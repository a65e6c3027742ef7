package refmodel_test

import (
	"testing"

	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/sim/refmodel"
)

// chunk returns slot's bytes of (layer, part), failing the test on a bad address.
func chunk(t testing.TB, l1 *kvmem.L1, slot int32, layer, part int) []byte {
	b, err := l1.HostChunk(slot, layer, part)
	if err != nil {
		t.Error(err)
	}
	return b
}

// Breakages of the data path, applied on each rank to its pages of a load-back once it
// landed: the oracle must report differing outputs for each.
var breakages = []struct {
	name     string
	variant  refmodel.Variant
	damage   breakage
	skipWait bool
}{
	// The prefill reads the loaded prefix without waiting for its layers (here: before the
	// copies even start, so it reads slots the load has not written).
	{name: "layer wait skipped", variant: refmodel.GQA, skipWait: true},
	// A load that put layer 0's bytes in layer 1 and layer 1's in layer 0.
	{name: "layers 0 and 1 swapped", variant: refmodel.GQA, damage: func(t testing.TB, l1 *kvmem.L1, loaded []int32) {
		for _, s := range loaded {
			for part := range l1.Shape().Parts() {
				a, b := chunk(t, l1, s, 0, part), chunk(t, l1, s, 1, part)
				for i := range a {
					a[i], b[i] = b[i], a[i]
				}
			}
		}
	}},
	// The same on the MLA latent.
	{name: "MLA layers 0 and 1 swapped", variant: refmodel.MLA, damage: func(t testing.TB, l1 *kvmem.L1, loaded []int32) {
		for _, s := range loaded {
			a, b := chunk(t, l1, s, 0, 0), chunk(t, l1, s, 1, 0)
			for i := range a {
				a[i], b[i] = b[i], a[i]
			}
		}
	}},
	// A page loaded into its neighbour's slot: the first loaded page's bytes in the second's
	// slot too (the second page's own bytes lost).
	{name: "page in the neighbour's slot", variant: refmodel.GQA, damage: func(t testing.TB, l1 *kvmem.L1, loaded []int32) {
		if len(loaded) < 2 {
			return
		}
		for layer := range l1.Shape().Layers() {
			for part := range l1.Shape().Parts() {
				copy(chunk(t, l1, loaded[1], layer, part), chunk(t, l1, loaded[0], layer, part))
			}
		}
	}},
	// A backup that dropped the side buffer: the loaded pages' "idx" part reads back zero.
	{name: "side buffer dropped", variant: refmodel.Side, damage: func(t testing.TB, l1 *kvmem.L1, loaded []int32) {
		idx := l1.Shape().Parts() - 1
		if l1.Shape().PartName(idx) != "idx" {
			t.Errorf("last part is %q, not the side buffer", l1.Shape().PartName(idx))
		}
		for _, s := range loaded {
			for layer := range l1.Shape().Layers() {
				clear(chunk(t, l1, s, layer, idx))
			}
		}
	}},
}

// breakageNamed is the damage of the breakages entry called name.
func breakageNamed(t testing.TB, name string) breakage {
	t.Helper()
	for _, b := range breakages {
		if b.name == name {
			return b.damage
		}
	}
	t.Fatalf("no breakage %q", name)
	return nil
}

// Each breakage of the data path makes the oracle see differing outputs (the oracle can
// fail), at CP 2 with every hit loaded back from L2.
func TestOracleCatchesBrokenPaths(t *testing.T) {
	const seed = 5
	for _, b := range breakages {
		t.Run(b.name, func(t *testing.T) {
			m, err := refmodel.New(refmodel.DefaultConfig(b.variant))
			if err != nil {
				t.Fatal(err)
			}
			ref, err := cacheOff(m, seed)
			if err != nil {
				t.Fatal(err)
			}
			got, st := cacheOn(t, m, seed, oracleConfig{variant: b.variant, cp: 2, evict: true, l2Layout: kvmem.PageFirst, damage: b.damage, skipWait: b.skipWait})
			d := differing(ref, got)
			if d == 0 {
				t.Errorf("outputs checked %d, differing 0 with %q (%+v): the oracle missed it", len(ref), b.name, st)
			}
			t.Logf("outputs checked %d, differing %d", len(ref), d)
		})
	}
}
