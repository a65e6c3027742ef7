package kvevents

import (
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
	ep := freeTCP(t, "*")
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
	base := map[string]uint64{}
	for _, s := range p.Subscribers() {
		base[s.Remote] = s.Received
	}
	read0 := got.Load()
	if fed := src.feed(seq, n, tokens, time.Now().Add(30*time.Second)); fed != n {
		t.Fatalf("fed %d of %d batches", fed, n)
	}
	// libzmq hands every batch to each subscriber's queue (the guard reads it at once).
	if !waitFor(30*time.Second, func() bool {
		for _, s := range p.Subscribers() {
			if s.Received < base[s.Remote]+uint64(n) {
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
			t.Errorf("%s: received %d != delivered %d + dropped %d + queued %d", s.Remote, s.Received, s.Delivered, s.Dropped, s.QueuedBatches)
		}
		if s.Received-base[s.Remote] != uint64(n) {
			t.Errorf("%s: received %d batches of the %d published", s.Remote, s.Received-base[s.Remote], n)
		}
		if s.QueuedBytes > bound {
			t.Errorf("%s: %d bytes queued, bound %d", s.Remote, s.QueuedBytes, bound)
		}
		if s.Delivered+uint64(s.QueuedBatches) < uint64(n)/2 { // not the reader
			stuckSeen++
			if s.Dropped == 0 {
				t.Errorf("%s (stuck): nothing dropped: %+v", s.Remote, s)
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
	if st.SubscriberQueuedBytes > conns*bound {
		t.Errorf("%d bytes queued for %d subscribers, bound %d each", st.SubscriberQueuedBytes, conns, bound)
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
	t.Logf("%d stuck: reader got %d of %d batches; dropped %d in all (%.0f per stuck subscriber); queued %s; heap +%s, RSS +%s",
		stuck, r.read, n, dropped, float64(dropped)/float64(max(stuck, 1)), mib(uint64(st.SubscriberQueuedBytes)), mib(r.heapGrown), mib(r.rssGrown))
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
// grows by at most that per connection (unbounded, each stuck subscriber would hold every
// batch: 32 × 9 MiB here).
func TestManyStuckSubscribers(t *testing.T) {
	const stuck, n, tokens, bound = 32, 400, 8192, 512 << 10
	alone := manyStuckPhase(t, 0, n, tokens, bound)
	beside := manyStuckPhase(t, stuck, n, tokens, bound)
	t.Logf("reader alone: %d of %d batches; beside %d stuck subscribers: %d (ratio %.2f)", alone.read, n, stuck, beside.read, float64(beside.read)/float64(alone.read))
	if alone.read == 0 || 2*beside.read < alone.read {
		t.Fatalf("beside %d stuck subscribers the reader got %d batches, alone %d: want at least half", stuck, beside.read, alone.read)
	}
}
