package kvevents

import (
	"encoding/binary"
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
	seqs := make(chan uint64, n)
	go func() {
		defer close(seqs)
		for {
			msg, err := reader.recv()
			if err != nil {
				return
			}
			seqs <- binary.BigEndian.Uint64(msg[1])
		}
	}()
	next := func() (uint64, bool) {
		select {
		case s, ok := <-seqs:
			return s, ok
		case <-time.After(10 * time.Second):
			return 0, false
		}
	}
	// Warm up until the reader gets batches (the stuck one subscribed first).
	var seq uint64
	for ; ; seq++ {
		src.feed(seq, 1, 16, time.Now().Add(time.Second))
		select {
		case s := <-seqs:
			seq = s
		case <-time.After(2 * time.Millisecond):
			continue
		}
		break
	}
	first := seq + 1
	for seq = first; seq < n; seq++ {
		src.feed(seq, 1, tokens, time.Now().Add(10*time.Second))
		got, ok := next()
		for ok && got < seq { // warm-up batches still on their way
			got, ok = next()
		}
		if !ok || got != seq {
			t.Fatalf("the reader got batch %d (%v), want %d: it lost batches", got, ok, seq)
		}
	}
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
