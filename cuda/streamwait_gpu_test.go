package cuda_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// TestGPUEventStreamWait: Event.StreamWait on a stream given by its raw handle (as another
// library, such as torch, would hand it over) orders that stream's later work after the
// work the event captured. On the fake driver, whose streams run only when waited for, it
// also shows that StreamWait runs nothing on the calling thread and that the event captured
// its stream's work up to the record and not the memset enqueued after it.
func TestGPUEventStreamWait(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	fake := os.Getenv(fakelib.Env) != ""
	const n = 1 << 20
	var bufs [3]*cuda.DeviceBuffer // a: set before the record, b: after it, c: copied from a by the waiting stream
	for i := range bufs {
		b, err := dev.Alloc(n)
		must(t, err)
		defer closeT(t, b)
		must(t, b.Fill(0))
		bufs[i] = b
	}
	a, b, c := bufs[0], bufs[1], bufs[2]
	must(t, dev.Synchronize())
	producer, err := dev.NewStream()
	must(t, err)
	defer closeT(t, producer)
	consumer, err := dev.NewStream()
	must(t, err)
	defer closeT(t, consumer)
	ev, err := dev.NewEvent(cuda.EventDisableTiming)
	must(t, err)
	defer closeT(t, ev)

	must(t, producer.Memset(a.Ptr(), 0x11, n))
	must(t, ev.Record(producer))
	must(t, producer.Memset(b.Ptr(), 0x22, n))
	must(t, ev.StreamWait(consumer.Handle()))
	must(t, ev.Record(producer)) // a later record: the wait already queued keeps the first one
	must(t, consumer.CopyDtoD(c.Ptr(), a.Ptr(), n))
	got := make([]byte, n)
	if fake {
		must(t, a.Read(0, got))
		if bytes.Equal(got, bytes.Repeat([]byte{0x11}, n)) {
			t.Errorf("StreamWait ran the producer's work on the calling thread")
		}
	}
	must(t, consumer.Synchronize())
	must(t, c.Read(0, got))
	if !bytes.Equal(got, bytes.Repeat([]byte{0x11}, n)) {
		t.Errorf("the waiting stream's copy ran before the work the event captured")
	}
	if fake {
		must(t, b.Read(0, got))
		if !bytes.Equal(got, make([]byte, n)) {
			t.Errorf("the stream wait ran the producer's work past the event's first record")
		}
	}
	must(t, producer.Synchronize())
	must(t, b.Read(0, got))
	if !bytes.Equal(got, bytes.Repeat([]byte{0x22}, n)) {
		t.Errorf("the producer's memset after the record did not land")
	}
	// The legacy default stream (handle 0) can wait too.
	must(t, ev.StreamWait(0))
	must(t, dev.Synchronize())
	must(t, ev.Close())
	if err := ev.StreamWait(consumer.Handle()); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("StreamWait on a closed event: %v, want the closed error", err)
	}
}

// TestGPUFakeBatchRejectsOverlap: the fake driver refuses a batch in which one copy writes
// where another reads or writes (the batch's copies may run in any order), so that the
// engines' tests catch chunk copies that land on each other; CopyBatch then falls back to
// per-copy and says why in BatchError. A real driver does not check this.
func TestGPUFakeBatchRejectsOverlap(t *testing.T) {
	if os.Getenv(fakelib.Env) == "" {
		t.Skip("checks the fake driver's batch validation; a real driver does not validate overlap")
	}
	_, dev := cudatest.RequireGPU(t)
	d, err := dev.Alloc(4 << 10)
	must(t, err)
	defer closeT(t, d)
	for _, tc := range []struct {
		name   string
		copies []cuda.Copy1
		bad    bool
	}{
		{"disjoint", []cuda.Copy1{{Dst: d.Ptr(), Src: d.Ptr().Add(2048), Size: 1024}, {Dst: d.Ptr().Add(1024), Src: d.Ptr().Add(2048), Size: 1024}}, false},
		{"dst over dst", []cuda.Copy1{{Dst: d.Ptr(), Src: d.Ptr().Add(2048), Size: 1024}, {Dst: d.Ptr().Add(1023), Src: d.Ptr().Add(3072), Size: 64}}, true},
		{"dst over src", []cuda.Copy1{{Dst: d.Ptr(), Src: d.Ptr().Add(2048), Size: 1024}, {Dst: d.Ptr().Add(2100), Src: d.Ptr().Add(3072), Size: 64}}, true},
		{"src under dst", []cuda.Copy1{{Dst: d.Ptr().Add(1000), Src: d.Ptr().Add(2048), Size: 24}, {Dst: d.Ptr().Add(3000), Src: d.Ptr().Add(900), Size: 200}}, true},
	} {
		s, err := dev.NewStream()
		must(t, err)
		batched, err := s.CopyBatch(tc.copies)
		must(t, err)
		must(t, s.Synchronize())
		berr := s.BatchError()
		if tc.bad && (batched || berr == nil || !strings.Contains(berr.Error(), "CUDA_ERROR_INVALID_VALUE")) {
			t.Errorf("%s: batched %v, BatchError %v: want the batch refused as invalid", tc.name, batched, berr)
		}
		if !tc.bad && (!batched || berr != nil) {
			t.Errorf("%s: batched %v, BatchError %v: want the batch call used", tc.name, batched, berr)
		}
		closeT(t, s)
	}
}
