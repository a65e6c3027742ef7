package cudaengine

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/slab"
)

// TestGPUStepBatching: SubmitStep enqueues a step's transfers as one copy call per direction
// and lane in use (per transfer with PerTransfer), a transfer with a bad page fails alone,
// and every page lands where its transfer said.
func TestGPUStepBatching(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	const pb, pages = 4 << 10, 24
	for _, c := range []struct {
		opts      Options
		wantCalls int64 // for 5 good backups, then 5 loads
	}{
		{Options{}, 1},
		{Options{Streams: 2}, 2},
		{Options{Streams: 8}, 5},
		{Options{PerTransfer: true}, 5},
	} {
		t.Run(fmt.Sprintf("streams=%d,per-transfer=%v", max(c.opts.Streams, 1), c.opts.PerTransfer), func(t *testing.T) {
			pool, err := newTestPool(dev, pages, pb, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			l1, e := pool.l1, pool.e
			want := make([]byte, pages*pb)
			for i := range want {
				want[i] = byte(i*5 + i/pb)
			}
			if err := l1.Write(0, want); err != nil {
				t.Fatal(err)
			}
			if err := dev.Synchronize(); err != nil {
				t.Fatal(err)
			}
			// Five transfers of 3 pages (slot s ↔ L2 page pages-1-s), and one whose second
			// page is outside the L1 pool.
			step := func(k core.Kind) []core.Transfer {
				var trs []core.Transfer
				for i := range 5 {
					tr := core.Transfer{Kind: k, Seq: uint64(i), Node: uint64(i)}
					for j := range 3 {
						s := i*3 + j
						tr.Copies = append(tr.Copies, core.Copy{L1: int32(s), L2: slab.Page{Index: pages - 1 - s}})
					}
					trs = append(trs, tr)
				}
				bad := core.Transfer{Kind: k, Seq: 9, Node: 9, Copies: []core.Copy{{L1: 20, L2: slab.Page{Index: 0}}, {L1: pages, L2: slab.Page{Index: 1}}}}
				return append(trs[:2], append([]core.Transfer{bad}, trs[2:]...)...)
			}
			for _, k := range []core.Kind{core.Write, core.Load} {
				if k == core.Load {
					if err := l1.Fill(0); err != nil {
						t.Fatal(err)
					}
					if err := dev.Synchronize(); err != nil {
						t.Fatal(err)
					}
				}
				calls := e.CopyCalls()
				trs := step(k)
				tks := e.SubmitStep(trs)
				for i, tk := range tks {
					err := tk.Err()
					if tk.Transfer.Node != trs[i].Node {
						t.Fatalf("%s: ticket %d is node %d's, want %d's", k, i, tk.Transfer.Node, trs[i].Node)
					}
					if bad := trs[i].Node == 9; bad != errors.Is(err, core.ErrBadArgument) {
						t.Errorf("%s of node %d: %v", k, trs[i].Node, err)
					}
				}
				if got := e.CopyCalls() - calls; got != c.wantCalls {
					t.Errorf("%s: %d copy calls, want %d", k, got, c.wantCalls)
				}
			}
			got := make([]byte, pages*pb)
			if err := l1.Read(0, got); err != nil {
				t.Fatal(err)
			}
			if n := 15 * pb; !bytes.Equal(got[:n], want[:n]) || !bytes.Equal(got[n:], make([]byte, len(got)-n)) {
				t.Error("the pages loaded back differ from the pages backed up, or pages no transfer named moved")
			}
		})
	}
}
