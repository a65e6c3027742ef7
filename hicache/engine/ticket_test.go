package engine

import (
	"errors"
	"testing"
)

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestLayeredTicketFinishesLayersInOrder(t *testing.T) {
	tk := NewLayeredTicket(Transfer{}, 4)
	if tk.Layers() != 4 {
		t.Fatalf("Layers = %d, want 4", tk.Layers())
	}
	tk.FinishLayer(1)
	for i, want := range []bool{true, true, false, false} {
		if got := closed(tk.LayerDone(i)); got != want {
			t.Fatalf("after FinishLayer(1): layer %d done = %v, want %v", i, got, want)
		}
	}
	if tk.Finished() || closed(tk.LayerDone(4)) {
		t.Fatal("ticket finished after its second layer")
	}
	if err := tk.LayerErr(0); err != nil {
		t.Fatalf("LayerErr(0) = %v", err)
	}
	tk.FinishLayer(0) // already done: no panic, nothing changes
	tk.Finish(nil)
	for i := range 5 {
		if !closed(tk.LayerDone(i)) {
			t.Fatalf("layer %d open after Finish", i)
		}
	}
}

func TestLayeredTicketFailureFailsEveryLayer(t *testing.T) {
	boom := errors.New("boom")
	tk := NewLayeredTicket(Transfer{}, 3)
	tk.FinishLayer(0)
	tk.Finish(boom)
	for i := range 3 {
		if err := tk.LayerErr(i); !errors.Is(err, boom) {
			t.Fatalf("LayerErr(%d) = %v, want the transfer's error", i, err)
		}
	}
}

func TestWholeTicketHasOneLayer(t *testing.T) {
	tk := NewTicket(Transfer{})
	if tk.Layers() != 1 || closed(tk.LayerDone(0)) {
		t.Fatal("a new ticket's layer is done or it has more than one")
	}
	tk.FinishLayer(7)
	if !closed(tk.LayerDone(0)) || tk.Finished() {
		t.Fatal("FinishLayer past the end should finish the only layer, not the ticket")
	}
	tk.Finish(nil)
	if !closed(tk.LayerDone(-1)) || !closed(tk.LayerDone(3)) {
		t.Fatal("out-of-range layers should follow Done")
	}
}
