package kvevents

import (
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"
)

// assertDropCounted: the connection a 2^62-byte frame closed is in the counters.
func assertDropCounted(t *testing.T, p *Publisher, target string) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool { return p.Stats().Cut > 0 }) {
		t.Fatalf("%s: the dropped connection is not counted: %+v", target, p.Stats())
	}
	t.Logf("%s: %+v", target, p.Stats())
}

func stuckReplayOptions(ep, replay string) Options {
	return Options{Endpoint: ep, ReplayEndpoint: replay, Linger: -1, ReplayTimeout: 500 * time.Millisecond}
}

// assertReplayCut: the stuck client's reply was cut and counted.
func assertReplayCut(t *testing.T, p *Publisher) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool { return p.Stats().ReplayCut > 0 }) {
		t.Fatalf("the stuck client's reply is not counted as cut: %+v", p.Stats())
	}
}

// TestLongEventRunMemoryIsFlat: with replay the history holds at most HistoryBytes; without
// it, nothing; and the Go heap after ten times the batches is what it was (the batches
// themselves, 24 KiB each, would be 45 MiB).
func TestLongEventRunMemoryIsFlat(t *testing.T) {
	const tokens, bound = 8192, 2 << 20
	for _, replay := range []bool{true, false} {
		o := Options{Endpoint: freeTCP(t, "*"), Linger: -1, HistoryBytes: bound}
		if replay {
			o.ReplayEndpoint = freeTCP(t, "127.0.0.1")
		}
		src := newStreamSource()
		p, err := Start(src, o)
		if err != nil {
			t.Fatal(err)
		}
		sub := dialZMTP(t, dialable(o.Endpoint), "SUB", true)
		sub.subscribe(t)
		countMessages(sub)
		published := func(n uint64) {
			if !waitFor(30*time.Second, func() bool { return p.Stats().Published == n }) {
				t.Fatalf("published %d of %d", p.Stats().Published, n)
			}
		}
		historyRun(t, o, src, 0, 200, tokens)
		published(200)
		h1 := heapAfterGC()
		historyRun(t, o, src, 200, 2000, tokens)
		published(2200)
		h2 := heapAfterGC()
		s := p.Stats()
		t.Logf("replay=%v: heap after 200 batches %s, after 2200 %s; history %d batches, %s", replay, mib(h1), mib(h2), s.HistoryBatches, mib(uint64(s.HistoryBytes)))
		if replay && (s.HistoryBytes > bound || s.HistoryBatches == 0) {
			t.Fatalf("history of %d bytes (%d batches), bound %d", s.HistoryBytes, s.HistoryBatches, bound)
		}
		if !replay && (s.HistoryBytes != 0 || s.HistoryBatches != 0) {
			t.Fatalf("without replay the history holds %d batches (%d bytes)", s.HistoryBatches, s.HistoryBytes)
		}
		if h2 > h1+8<<20 {
			t.Fatalf("heap grew from %s to %s over 2000 batches", mib(h1), mib(h2))
		}
		p.Close()
	}
}

// TestEndlessMessageCut: a peer that sends a message of frames that never ends (each frame
// small, every one marked "more"), to the PUB or to the replay ROUTER, is cut at the fifth
// frame, counted, and the publisher's memory does not follow what it sends (libzmq alone
// would hold every frame until the last).
func TestEndlessMessageCut(t *testing.T) {
	for _, target := range []string{"pub", "replay"} {
		t.Run(target, func(t *testing.T) {
			o := Options{Endpoint: freeTCP(t, "*"), ReplayEndpoint: freeTCP(t, "127.0.0.1"), Linger: -1}
			p, err := Start(newStreamSource(), o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ep, typ := dialable(o.Endpoint), "SUB"
			if target == "replay" {
				ep, typ = o.ReplayEndpoint, "DEALER"
			}
			c := dialZMTP(t, ep, typ, true)
			frame := append([]byte{0x01, 0xff}, make([]byte, 255)...) // "more", 255 bytes
			var chunk []byte
			for len(chunk) < 1<<20 {
				chunk = append(chunk, frame...)
			}
			before := heapAfterGC()
			sent := 0
			_ = c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			for i := 0; i < 64; i++ {
				if _, err := c.c.Write(chunk); err != nil {
					break
				}
				sent += len(chunk)
			}
			if !c.closedWithin(10 * time.Second) {
				t.Fatal("the endless message's connection stayed open")
			}
			if !waitFor(10*time.Second, func() bool { return p.Stats().Cut == 1 }) {
				t.Fatalf("cut connections: %+v, want 1", p.Stats())
			}
			if after := heapAfterGC(); after > before+4<<20 {
				t.Fatalf("heap grew from %s to %s", mib(before), mib(after))
			}
			t.Logf("sent %s before the cut; %+v", mib(uint64(sent)), p.Stats())
		})
	}
}

// readSeqs reads r's batches and hands on their seqs until its connection ends.
func readSeqs(r *zmtpPeer) <-chan uint64 {
	seqs := make(chan uint64, 1024)
	go func() {
		defer close(seqs)
		for {
			msg, err := r.recv()
			if err != nil {
				return
			}
			seqs <- binary.BigEndian.Uint64(msg[1])
		}
	}()
	return seqs
}

// nextSeq is the next seq from seqs; false when none comes within 10 s.
func nextSeq(seqs <-chan uint64) (uint64, bool) {
	select {
	case s, ok := <-seqs:
		return s, ok
	case <-time.After(10 * time.Second):
		return 0, false
	}
}

// untilSubscribed feeds small batches, seq 0, 1, ..., each once the wait for the one before
// (2 ms, doubling up to 1 s) ran out, until the subscriber behind seqs gets the last one
// fed: its subscription has then reached the PUB socket (libzmq sends a subscriber nothing
// before) and no batch is on its way (they come in order). At most 10 s in all; it returns
// the seq after the last one fed.
func untilSubscribed(t *testing.T, src *streamSource, seqs <-chan uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	wait := 2 * time.Millisecond
	for seq := uint64(0); time.Now().Before(deadline); seq, wait = seq+1, min(2*wait, time.Second) {
		if src.feed(seq, 1, 16, deadline) == 0 {
			break
		}
		timer := time.NewTimer(wait)
	waiting:
		for {
			select {
			case s, ok := <-seqs:
				if !ok {
					t.Fatal("the subscriber's connection ended")
				}
				if s == seq {
					timer.Stop()
					return seq + 1
				}
			case <-timer.C:
				break waiting
			}
		}
	}
	t.Fatal("the subscriber got no batch it was the last one fed within 10 s")
	return 0
}

// lockstep publishes batches from seq first to n-1, each once the subscriber behind seqs
// has the one before, and fails unless each comes, in order.
func lockstep(t *testing.T, p *Publisher, src *streamSource, seqs <-chan uint64, first, n uint64, tokens int) {
	t.Helper()
	for seq := first; seq < n; seq++ {
		if src.feed(seq, 1, tokens, time.Now().Add(10*time.Second)) == 0 {
			t.Fatalf("the publisher took no batch %d within 10 s", seq)
		}
		got, ok := nextSeq(seqs)
		if !ok || got != seq {
			t.Fatalf("the reader got batch %d (%v), want %d: it lost batches; subscribers %+v", got, ok, seq, p.Subscribers())
		}
	}
}

// TestReadingSubscriberLosesNothingAtSendHWM1: a subscriber that takes each batch before
// the next one is published has none queued when the next comes, so it gets every batch
// even at the smallest SendHWM, 1. libzmq learns that a subscriber took a batch from a
// command its I/O thread leaves for the PUB socket, which a send alone processes at most
// once a millisecond (3 million CPU ticks); the publisher has it processed before each
// batch, else batches published faster than that were dropped for a subscriber that had
// taken every one before.
func TestReadingSubscriberLosesNothingAtSendHWM1(t *testing.T) {
	const n = 500
	for _, transport := range []string{"tcp", "ipc"} {
		t.Run(transport, func(t *testing.T) {
			ep := freeTCP(t, "*")
			if transport == "ipc" {
				ep = "ipc://" + filepath.Join(shortDir(t), "pub")
			}
			src := newStreamSource()
			p, err := Start(src, Options{Endpoint: ep, Linger: -1, SendHWM: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			reader := dialZMTP(t, dialable(ep), "SUB", true)
			reader.subscribe(t)
			seqs := readSeqs(reader)
			first := untilSubscribed(t, src, seqs)
			before := p.Stats().SubscriberDropped // warm-up batches a slow start overflowed
			lockstep(t, p, src, seqs, first, first+n, 16)
			if s := p.Stats(); s.SubscriberDropped != before {
				t.Fatalf("the guard dropped batches: %d before, %+v", before, s)
			}
		})
	}
}

// TestStuckSubscriberLosesItsOwnBatches: past its queue (SendHWM) a subscriber that does
// not read loses batches — its own only: when it reads again it sees the gap in seq, while
// a reading subscriber beside it (each batch published once it has the previous one) got
// every batch in order.
func TestStuckSubscriberLosesItsOwnBatches(t *testing.T) {
	const n, tokens = 300, 8192
	ep := freeTCP(t, "*")
	src := newStreamSource()
	p, err := Start(src, Options{Endpoint: ep, Linger: -1, SendHWM: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stuck := dialZMTPBuf(t, dialable(ep), "SUB", true, 4096)
	stuck.subscribe(t)
	reader := dialZMTP(t, dialable(ep), "SUB", true)
	reader.subscribe(t)
	seqs := readSeqs(reader)
	// The stuck one subscribed first: once the reader gets batches, both do.
	first := untilSubscribed(t, src, seqs)
	lockstep(t, p, src, seqs, first, n, tokens)
	// The stuck one reads now: what it held, then a gap.
	var got []uint64
	stuck.setDeadline(2 * time.Second)
	for {
		msg, err := stuck.recv()
		if err != nil {
			break
		}
		if s := binary.BigEndian.Uint64(msg[1]); s >= first {
			got = append(got, s)
		}
	}
	if len(got) >= n-int(first) {
		t.Fatalf("the stuck subscriber lost nothing (%d batches)", len(got))
	}
	t.Logf("reader: batches %d..%d, all in order; stuck subscriber: %d of them, %d lost", first, n-1, len(got), n-int(first)-len(got))
}
