package kvevents

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vmRSS is the process's resident memory (Go heap and libzmq's), 0 where /proc has none.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// manyStuckResult is what one phase of TestManyStuckSubscribers saw.
type manyStuckResult struct {
	read      int64  // batches the reader got
	heapGrown uint64 // Go heap after GC at the end, over the heap before Start
	rssGrown  uint64
}

// manyStuckPhase publishes n batches of tokens tokens to a reading subscriber beside stuck
// subscribers that subscribe and never read, each queue bounded to bound bytes, and checks
// the stuck ones' counters.
func manyStuckPhase(t *testing.T, stuck, n, tokens int, bound int64) manyStuckResult {
	heap0, rss0 := heapAfterGC(), vmRSS()
	ep := "ipc://" + shortDir(t) + "/pub" // the kernel buffers little for a Unix socket
	src := newStreamSource()
	p, err := Start(src, Options{Endpoint: ep, Linger: -1, SubscriberQueueBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < stuck; i++ {
		s := dialZMTPBuf(t, dialable(ep), "SUB", true, 4096)
		s.subscribe(t)
	}
	reader := dialZMTP(t, dialable(ep), "SUB", true)
	reader.subscribe(t)
	got := countMessages(reader)
	// Warm up until every subscription is in effect: each connection got a batch.
	var seq uint64
	for !(got.Load() > 0 && allReceived(p.Subscribers(), stuck+1)) {
		if seq > 5000 {
			t.Fatalf("after %d batches not every subscriber got one: %+v", seq, p.Subscribers())
		}
		src.feed(seq, 1, 16, time.Now().Add(time.Second))
		seq++
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	base := map[uint64]uint64{}
	for _, s := range p.Subscribers() {
		base[s.Conn] = s.Received
	}
	read0 := got.Load()
	if fed := src.feed(seq, n, tokens, time.Now().Add(30*time.Second)); fed != n {
		t.Fatalf("fed %d of %d batches", fed, n)
	}
	// libzmq hands every batch to each subscriber's queue (the guard reads it at once).
	if !waitFor(30*time.Second, func() bool {
		for _, s := range p.Subscribers() {
			if s.Received < base[s.Conn]+uint64(n) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("not every subscriber's queue received the %d batches: %+v", n, p.Subscribers())
	}
	// The reader has what it will get once its count stops moving.
	last, quiet := got.Load(), 0
	for end := time.Now().Add(30 * time.Second); quiet < 20 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if c := got.Load(); c != last {
			last, quiet = c, 0
		} else {
			quiet++
		}
	}
	st := p.Stats()
	heap1, rss1 := heapAfterGC(), vmRSS()
	subs := p.Subscribers()
	var dropped uint64
	stuckSeen := 0
	for _, s := range subs {
		dropped += s.Dropped
		if s.Received != s.Delivered+s.Dropped+uint64(s.QueuedBatches) {
			t.Errorf("conn %d: received %d != delivered %d + dropped %d + queued %d", s.Conn, s.Received, s.Delivered, s.Dropped, s.QueuedBatches)
		}
		if s.Received-base[s.Conn] != uint64(n) {
			t.Errorf("conn %d: received %d batches of the %d published", s.Conn, s.Received-base[s.Conn], n)
		}
		if s.QueuedBytes > bound {
			t.Errorf("conn %d: %d bytes queued, bound %d", s.Conn, s.QueuedBytes, bound)
		}
		if s.Delivered+uint64(s.QueuedBatches) < uint64(n)/2 { // not the reader
			stuckSeen++
			if s.Dropped == 0 {
				t.Errorf("conn %d (stuck): nothing dropped: %+v", s.Conn, s)
			}
		}
	}
	if stuckSeen != stuck || len(subs) != stuck+1 {
		t.Errorf("%d subscribers, %d of them stuck; want %d stuck beside a reader: %+v", len(subs), stuckSeen, stuck, subs)
	}
	if st.SubscriberDropped != dropped {
		t.Errorf("Stats.SubscriberDropped %d, the subscribers' drops sum to %d", st.SubscriberDropped, dropped)
	}
	conns := int64(stuck + 1)
	if st.SubscriberQueuedBytes > conns*bound || st.SubscriberHeldBytes > st.SubscriberQueuedBytes {
		t.Errorf("%d bytes queued for %d subscribers (bound %d each), %d held", st.SubscriberQueuedBytes, conns, bound, st.SubscriberHeldBytes)
	}
	// Each connection: its queue, the reader's 64 KiB and the forwarder's 32 KiB buffers,
	// goroutines; 8 MiB for the rest of the process.
	limit := uint64(conns*(bound+128<<10)) + 8<<20
	if heap1 > heap0 && heap1-heap0 > limit {
		t.Errorf("Go heap grew by %s with %d subscribers (bound %s)", mib(heap1-heap0), conns, mib(limit))
	}
	r := manyStuckResult{read: last - read0}
	if heap1 > heap0 {
		r.heapGrown = heap1 - heap0
	}
	if rss1 > rss0 {
		r.rssGrown = rss1 - rss0
	}
	t.Logf("%d stuck: reader got %d of %d batches; dropped %d in all (%.0f per stuck subscriber); queued %s, held %s; heap +%s, RSS +%s",
		stuck, r.read, n, dropped, float64(dropped)/float64(max(stuck, 1)), mib(uint64(st.SubscriberQueuedBytes)), mib(uint64(st.SubscriberHeldBytes)), mib(r.heapGrown), mib(r.rssGrown))
	p.Close()
	if st := p.Stats(); st.SubscriberQueuedBytes != 0 || st.SubscriberHeldBytes != 0 {
		t.Errorf("closed, the queues still count %d bytes queued, %d held", st.SubscriberQueuedBytes, st.SubscriberHeldBytes)
	}
	return r
}

func allReceived(subs []SubscriberStats, want int) bool {
	if len(subs) != want {
		return false
	}
	for _, s := range subs {
		if s.Received == 0 {
			return false
		}
	}
	return true
}

// TestManyStuckSubscribers: 32 subscribers that subscribe and never read, beside one that
// reads, while big batches (24 KiB each) are published: the reader gets at least half of
// what it gets alone; each stuck one loses its own batches, counted (received = delivered
// + dropped + queued); the queues hold at most their byte bound each, and the Go heap
// grows by at most that per connection (unbounded, each stuck subscriber would queue every
// batch: 32 × 14 MiB here).
func TestManyStuckSubscribers(t *testing.T) {
	const stuck, n, tokens, bound = 32, 600, 8192, 2 << 20
	alone := manyStuckPhase(t, 0, n, tokens, bound)
	beside := manyStuckPhase(t, stuck, n, tokens, bound)
	t.Logf("reader alone: %d of %d batches; beside %d stuck subscribers: %d (ratio %.2f)", alone.read, n, stuck, beside.read, float64(beside.read)/float64(alone.read))
	if alone.read == 0 || 2*beside.read < alone.read {
		t.Fatalf("beside %d stuck subscribers the reader got %d batches, alone %d: want at least half", stuck, beside.read, alone.read)
	}
}

// pubStream is what libzmq sends a subscriber: its greeting, READY, then msgs, each
// [topic, seq, payload] (payloads over 255 bytes in long frames).
func pubStream(msgs ...[]byte) []byte {
	ready := append([]byte{0x04}, "\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB"...)
	var frames [][]byte
	frames = append(frames, ready)
	for i, m := range msgs {
		frames = append(frames, []byte{0x01}, append([]byte{0x01}, byte(i), 0, 0, 0, 0, 0, 0, 0), append([]byte{0x00}, m...))
	}
	return stream(frames...)
}

// parseUnits checks that b is a valid ZMTP stream from a PUB (greeting, commands, whole
// 3-frame messages) and returns the messages' payloads.
func parseUnits(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) < 64 || b[0] != 0xff {
		t.Fatalf("no greeting")
	}
	b = b[64:]
	var out [][]byte
	var msg [][]byte
	for len(b) > 0 {
		flags := b[0]
		var n uint64
		if flags&0x02 != 0 {
			n, b = binary.BigEndian.Uint64(b[1:9]), b[9:]
		} else {
			n, b = uint64(b[1]), b[2:]
		}
		if uint64(len(b)) < n {
			t.Fatalf("a frame of %d bytes cut at %d", n, len(b))
		}
		body := b[:n]
		b = b[n:]
		if flags&0x04 != 0 {
			if len(msg) > 0 {
				t.Fatal("a command inside a message")
			}
			continue
		}
		msg = append(msg, body)
		if flags&0x01 == 0 {
			if len(msg) != 3 {
				t.Fatalf("a message of %d frames", len(msg))
			}
			out = append(out, msg[2])
			msg = nil
		}
	}
	if len(msg) > 0 {
		t.Fatal("the stream ends inside a message")
	}
	return out
}

// TestStreamSplitter: the subscriber's queue passes the handshake and whole messages
// however libzmq's stream is split; when a message does not fit it is dropped whole and
// counted, and what is queued stays a valid ZMTP stream; equal messages of two queues share
// their bytes.
func TestStreamSplitter(t *testing.T) {
	var msgs [][]byte
	for i := 0; i < 12; i++ {
		m := make([]byte, 100+i*300) // short and long frames
		for j := range m {
			m[j] = byte(i + j)
		}
		msgs = append(msgs, m)
	}
	in := pubStream(msgs...)
	for _, bound := range []int64{1 << 20, 4 << 10} {
		for _, step := range []int{1, 7, 4096, len(in)} {
			var totals subscriberTotals
			pool := newMsgPool(&totals.held)
			q := newOutQueue(bound, 1000, &totals, pool)
			sp := &streamSplitter{q: q}
			for b := in; len(b) > 0; {
				k := min(step, len(b))
				if err := sp.feed(b[:k]); err != nil {
					t.Fatalf("bound %d step %d: %v", bound, step, err)
				}
				b = b[k:]
			}
			var out []byte
			for _, u := range q.units {
				out = append(out, u.b...)
			}
			got := parseUnits(t, out)
			s := q.stats(1, "x")
			if s.Received != uint64(len(msgs)) || s.Received != s.Dropped+uint64(s.QueuedBatches) || s.QueuedBytes != int64(len(out)) || totals.queued.Load() != int64(len(out)) {
				t.Fatalf("bound %d step %d: %+v, %d bytes out, totals %d", bound, step, s, len(out), totals.queued.Load())
			}
			if bound == 1<<20 && len(got) != len(msgs) || bound < 1<<20 && (s.Dropped == 0 || len(got) == 0) || s.QueuedBytes > bound {
				t.Fatalf("bound %d step %d: %d of %d messages queued, %+v", bound, step, len(got), len(msgs), s)
			}
			// The queued ones are the first ones that fitted, in order, whole.
			for i, j := 0, 0; i < len(got); i++ {
				for j < len(msgs) && len(msgs[j]) != len(got[i]) {
					j++
				}
				if j == len(msgs) || string(msgs[j]) != string(got[i]) {
					t.Fatalf("bound %d step %d: message %d is no message sent", bound, step, i)
				}
			}
			// A second queue fed the same stream shares the pooled messages.
			held := totals.held.Load()
			q2 := newOutQueue(bound, 1000, &totals, pool)
			if err := (&streamSplitter{q: q2}).feed(in); err != nil {
				t.Fatal(err)
			}
			if bound == 1<<20 && totals.held.Load() != held {
				t.Fatalf("two queues of the same messages hold %d bytes, one %d", totals.held.Load(), held)
			}
			q.close()
			q2.close()
			if totals.queued.Load() != 0 || totals.held.Load() != 0 {
				t.Fatalf("closed queues count %d queued, %d held", totals.queued.Load(), totals.held.Load())
			}
		}
	}
}

// TestStuckReplayClientClosed: a replay client that asks for everything and reads nothing
// is closed once its connection takes nothing for ReplayTimeout, which frees what libzmq
// queued for it (up to ReplayHWM batches); left open, a thousand such clients would each
// keep 64 batches.
func TestStuckReplayClientClosed(t *testing.T) {
	const n, tokens = 300, 8192
	d := shortDir(t)
	ep, replayEp := "ipc://"+d+"/pub", "ipc://"+d+"/replay"
	src := newStreamSource()
	p, err := Start(src, stuckReplayOptions(ep, replayEp))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if fed := src.feed(0, n, tokens, time.Now().Add(20*time.Second)); fed != n {
		t.Fatalf("fed %d of %d batches", fed, n)
	}
	if !waitFor(20*time.Second, func() bool { return p.Stats().HistoryBatches == n }) {
		t.Fatalf("the history holds %d of %d batches", p.Stats().HistoryBatches, n)
	}
	stuck := dialZMTPBuf(t, replayEp, "DEALER", true, 4096)
	stuck.send(t, nil, make([]byte, 8))
	if !waitFor(20*time.Second, func() bool { return p.Stats().ReplayCut > 0 }) {
		t.Fatalf("the stuck client's reply is not cut: %+v", p.Stats())
	}
	time.Sleep(4 * stuckReplayOptions(ep, replayEp).ReplayTimeout) // the stall bound passes
	if !stuck.closedWithin(10 * time.Second) {
		t.Fatal("the replay client that read nothing is still connected")
	}
	// Another client is served in full.
	reader := dialZMTP(t, replayEp, "DEALER", true)
	if got := replayAll(t, reader, 20*time.Second); len(got) != n {
		t.Fatalf("replay after the stuck client: %d batches, want %d", len(got), n)
	}
}

// TestBatchBeingWrittenIsNotQueued: at SendHWM 1 a subscriber's queue whose writer is
// writing a batch to the connection takes the next batch, and drops the one after (one
// waiting, one being written): the peer may have all of a batch before the writer's write
// returns, so a peer that takes each batch before the next is published must lose none.
func TestBatchBeingWrittenIsNotQueued(t *testing.T) {
	msgs := [][]byte{bytes.Repeat([]byte{'a'}, 1000), bytes.Repeat([]byte{'b'}, 1000), bytes.Repeat([]byte{'c'}, 1000)}
	in := pubStream(msgs...)
	cut1, cut2 := len(pubStream(msgs[0])), len(pubStream(msgs[:2]...))
	var totals subscriberTotals
	q := newOutQueue(1<<20, 1, &totals, newMsgPool(&totals.held))
	peer, conn := net.Pipe() // a write returns once the peer has read all of it
	defer peer.Close()
	wrote := make(chan error, 1)
	go func() { wrote <- q.write(conn) }()
	sp := &streamSplitter{q: q}
	if err := sp.feed(in[:cut1]); err != nil {
		t.Fatal(err)
	}
	// The peer reads all of the first batch but its last byte: the writer is writing it.
	_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, cut2)
	if _, err := io.ReadFull(peer, got[:cut1-1]); err != nil {
		t.Fatal(err)
	}
	if err := sp.feed(in[cut1:cut2]); err != nil {
		t.Fatal(err)
	}
	if s := q.stats(1, "x"); s.Received != 2 || s.Dropped != 0 || s.QueuedBatches != 2 {
		t.Fatalf("the batch after the one being written: %+v, want it queued", s)
	}
	if err := sp.feed(in[cut2:]); err != nil {
		t.Fatal(err)
	}
	if s := q.stats(1, "x"); s.Received != 3 || s.Dropped != 1 || s.QueuedBatches != 2 {
		t.Fatalf("a second batch waiting at SendHWM 1: %+v, want it dropped", s)
	}
	if _, err := io.ReadFull(peer, got[cut1-1:]); err != nil {
		t.Fatal(err)
	}
	if p := parseUnits(t, got); len(p) != 2 || !bytes.Equal(p[0], msgs[0]) || !bytes.Equal(p[1], msgs[1]) {
		t.Fatalf("the peer got %d batches, want the first two", len(p))
	}
	q.close()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if s := q.stats(1, "x"); s.Delivered != 2 {
		t.Fatalf("%+v, want 2 delivered", s)
	}
}
