package hostengine

import (
	"errors"
	"testing"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/slab"
)

// In the layered mode a backup gathers each L1 slot's chunks into its L2 page in the chosen
// layout (the page-first bytes check), and a load scatters them back into other slots chunk by
// chunk; the load's ticket reports its layers, and once layer 0 is done layer 0 of every page
// of the load has landed.
func TestLayeredBackupAndLoad(t *testing.T) {
	lay, err := kvlayout.Parse("layers=6;k=32:sharded;v=32:sharded;ix=5:replicated")
	if err != nil {
		t.Fatal(err)
	}
	s, err := kvmem.NewShape(lay, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	const slots, perSlab, pages = 8, 6, 5
	for _, l2 := range []kvmem.L2Layout{kvmem.PageFirst, kvmem.LayerFirst} {
		l1, err := kvmem.NewL1(s, slots, kvmem.AllocTokenSlotBuffers(s, slots))
		if err != nil {
			t.Fatal(err)
		}
		slabs := kvtest.NewMemSlabs([]int{0, 1}, perSlab, int(s.PageBytes()))
		e, err := NewKV(slabs, l1, l2, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var write, load core.Transfer
		write.Kind, load.Kind = core.Write, core.Load
		for i := range pages {
			if err := kvtest.FillL1Page(l1, int32(i), 0x100+uint64(i), i, 1); err != nil {
				t.Fatal(err)
			}
			p := slab.Page{Slab: i % 2, Index: 1 + i/2}
			write.Copies = append(write.Copies, core.Copy{L1: int32(i), L2: p})
			load.Copies = append(load.Copies, core.Copy{L1: int32(slots - 1 - i), L2: p})
		}
		wt := e.Submit(write)
		if wt.Layers() != s.Layers() {
			t.Fatalf("%s: a layered engine's ticket has %d layers, want %d", l2, wt.Layers(), s.Layers())
		}
		if err := wt.Err(); err != nil {
			t.Fatal(err)
		}
		pf := make([]byte, s.PageBytes())
		for i, c := range write.Copies {
			mem, _ := slabs.SlabMemory(c.L2.Slab)
			if err := s.ReadPageFirst(pf, l2, mem, perSlab, c.L2.Index); err != nil {
				t.Fatal(err)
			}
			if err := kvtest.CheckPageFirst(pf, s, 0x100+uint64(i), i, 1); err != nil {
				t.Fatalf("%s: backed-up page %d: %v", l2, i, err)
			}
		}
		lt := e.Submit(load)
		if err := lt.LayerErr(0); err != nil {
			t.Fatal(err)
		}
		for i, c := range load.Copies {
			for j := range s.Parts() {
				got, _ := l1.HostChunk(c.L1, 0, j)
				want := make([]byte, len(got))
				kvtest.FillChunk(want, 0x100+uint64(i), i, 0, j, 1)
				if string(got) != string(want) {
					t.Fatalf("%s: layer 0 done, page %d part %d of layer 0 not landed", l2, i, j)
				}
			}
		}
		if err := lt.Err(); err != nil {
			t.Fatal(err)
		}
		for i, c := range load.Copies {
			if err := kvtest.CheckL1Page(l1, c.L1, 0x100+uint64(i), i, 1); err != nil {
				t.Fatalf("%s: loaded page %d: %v", l2, i, err)
			}
		}
		bad := core.Transfer{Kind: core.Load, Copies: []core.Copy{{L1: slots, L2: slab.Page{Slab: 0, Index: 0}}}}
		if err := e.Submit(bad).Err(); !errors.Is(err, core.ErrBadArgument) {
			t.Errorf("%s: load into slot %d of %d: %v, want ErrBadArgument", l2, slots, slots, err)
		}
		if _, err := e.L1Page(0); !errors.Is(err, core.ErrBadArgument) {
			t.Errorf("L1Page of a layered engine: %v", err)
		}
		e.Close()
	}
}

func TestNewKVRejects(t *testing.T) {
	l, _ := kvlayout.Preset("deepseek-v3")
	s, _ := kvmem.NewShape(l, 1, 2)
	l1, err := kvmem.NewL1(s, 2, kvmem.AllocTokenSlotBuffers(s, 2))
	if err != nil {
		t.Fatal(err)
	}
	good := kvtest.NewMemSlabs([]int{0}, 2, int(s.PageBytes()))
	for name, f := range map[string]func() error{
		"page size": func() error {
			_, err := NewKV(kvtest.NewMemSlabs([]int{0}, 2, 64), l1, kvmem.PageFirst, Options{})
			return err
		},
		"no layout":  func() error { _, err := NewKV(good, l1, 0, Options{}); return err },
		"no L1":      func() error { _, err := NewKV(good, nil, kvmem.PageFirst, Options{}); return err },
		"flat pool":  func() error { _, err := NewKV(good, l1, kvmem.PageFirst, Options{Pool: []byte{1}}); return err },
		"page slabs": func() error { _, err := NewKV(pageOnly{good}, l1, kvmem.LayerFirst, Options{}); return err },
	} {
		if err := f(); !errors.Is(err, core.ErrBadConfig) {
			t.Errorf("%s: %v, want ErrBadConfig", name, err)
		}
	}
}

// pageOnly hides MemSlabs' SlabMemory.
type pageOnly struct{ m *kvtest.MemSlabs }

func (p pageOnly) Page(pg slab.Page) ([]byte, error) { return p.m.Page(pg) }
