package kvevents

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache"
)

// streamSource feeds batches to a publisher as a cache with no ring would: Subscribe's
// channel, nothing to replay from.
type streamSource struct {
	ch   chan hicache.EventBatch
	next uint64
}

func newStreamSource() *streamSource { return &streamSource{ch: make(chan hicache.EventBatch, 16)} }

func (s *streamSource) Subscribe(uint64) (<-chan hicache.EventBatch, func(), error) {
	var once sync.Once
	return s.ch, func() { once.Do(func() { close(s.ch) }) }, nil
}
func (s *streamSource) EventsSince(uint64) ([]hicache.EventBatch, error) { return nil, nil }
func (s *streamSource) NextEventSeq() (uint64, error)                    { return s.next, nil }

// bigBatch is batch seq: one stored page of tokens tokens (every token id in a batch,
// as a step that stored a long prompt makes).
func bigBatch(seq uint64, tokens int) hicache.EventBatch {
	toks := make([]int32, tokens)
	for i := range toks {
		toks[i] = int32(1000 + (i*7919+int(seq))%30000)
	}
	return hicache.EventBatch{Seq: seq, Time: time.Unix(1700000000, 0), Events: []hicache.Event{{
		Kind: hicache.EventStored, Tier: hicache.TierDevice, Hashes: hicache.PrefixHashes([]int32{int32(seq)}, 1), Tokens: toks}}}
}

// feed hands n batches of tokens tokens from seq first on to the publisher, giving up at
// deadline (a publisher that stopped reading its source); it returns how many it handed.
func (s *streamSource) feed(first uint64, n, tokens int, deadline time.Time) int {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for i := 0; i < n; i++ {
		select {
		case s.ch <- bigBatch(first+uint64(i), tokens):
			s.next = first + uint64(i) + 1
		case <-timer.C:
			return i
		}
	}
	return n
}

// feedEveryMillisecond hands src a small batch every millisecond until the returned stop
// is called (or the publisher stops reading); stop waits for the feeder to end.
func feedEveryMillisecond(src *streamSource) (stop func()) {
	done, fed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(fed)
		for seq := uint64(0); ; seq++ {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			if src.feed(seq, 1, 16, time.Now().Add(5*time.Second)) == 0 {
				return
			}
		}
	}()
	return func() { close(done); <-fed }
}

// counter counts the messages a subscriber reads until its connection closes.
func countMessages(p *zmtpPeer) *atomic.Int64 {
	var n atomic.Int64
	go func() {
		for {
			if _, err := p.recv(); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	return &n
}

// waitFor polls cond every 10ms up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kvz")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestHugeFrameDropsOnlyThatPeer: a frame header declaring 2^62 bytes, or one byte more
// than MaxMessageBytes (a size libzmq could allocate), sent to the PUB or to the replay
// ROUTER, over TCP or ipc, during the handshake (a command) or after it (a message), closes
// that connection at once and is counted; the publisher lives on and a healthy subscriber
// keeps getting batches.
func TestHugeFrameDropsOnlyThatPeer(t *testing.T) {
	sizes := map[string]uint64{"2^62": 1 << 62, "bound+1": DefaultMaxMessageBytes + 1}
	for _, transport := range []string{"tcp", "ipc"} {
		for _, target := range []string{"pub", "replay"} {
			for _, when := range []string{"handshake", "message"} {
				for sizeName, size := range sizes {
					t.Run(transport+"/"+target+"/"+when+"/"+sizeName, func(t *testing.T) {
						var pubEp, replayEp string
						if transport == "tcp" {
							pubEp, replayEp = freeTCP(t, "*"), freeTCP(t, "127.0.0.1")
						} else {
							d := shortDir(t)
							pubEp, replayEp = "ipc://"+filepath.Join(d, "pub"), "ipc://"+filepath.Join(d, "replay")
						}
						src := newStreamSource()
						p, err := Start(src, Options{Endpoint: pubEp, ReplayEndpoint: replayEp, Linger: -1})
						if err != nil {
							t.Fatal(err)
						}
						defer p.Close()
						healthy := dialZMTP(t, dialable(pubEp), "SUB", true)
						healthy.subscribe(t)
						got := countMessages(healthy)
						defer feedEveryMillisecond(src)()
						if !waitFor(10*time.Second, func() bool { return got.Load() > 0 }) {
							t.Fatal("the healthy subscriber got nothing")
						}
						ep, typ := dialable(pubEp), "SUB"
						if target == "replay" {
							ep, typ = replayEp, "DEALER"
						}
						attacker := dialZMTP(t, ep, typ, when == "message")
						attacker.write(t, hugeFrame(when == "handshake", size))
						if !attacker.closedWithin(10 * time.Second) {
							t.Fatal("the publisher kept the connection that declared a 2^62-byte frame")
						}
						before := got.Load()
						if !waitFor(10*time.Second, func() bool { return got.Load() >= before+20 }) {
							t.Fatalf("the healthy subscriber got %d batches after the attack, want 20 more", got.Load()-before)
						}
						assertDropCounted(t, p, target)
					})
				}
			}
		}
	}
}

// phase publishes n batches of tokens tokens to a reading subscriber, beside a subscriber
// that subscribes and never reads when stuck is set, and returns how many the reader got.
func stuckPhase(t *testing.T, stuck bool, n, tokens int) int64 {
	ep := freeTCP(t, "*")
	src := newStreamSource()
	p, err := Start(src, Options{Endpoint: ep, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if stuck {
		s := dialZMTPBuf(t, dialable(ep), "SUB", true, 4096)
		s.subscribe(t)
	}
	reader := dialZMTP(t, dialable(ep), "SUB", true)
	reader.subscribe(t)
	got := countMessages(reader)
	// Warm up until the reader's subscription is in effect (the stuck one's went first).
	var seq uint64
	for got.Load() == 0 {
		if seq > 5000 {
			t.Fatal("the reader got nothing")
		}
		src.feed(seq, 1, 16, time.Now().Add(time.Second))
		seq++
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	base := got.Load()
	fed := src.feed(seq, n, tokens, time.Now().Add(15*time.Second))
	// The reader has what it will get once its count stops moving.
	last, quiet := got.Load(), 0
	for end := time.Now().Add(20 * time.Second); quiet < 20 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if c := got.Load(); c != last {
			last, quiet = c, 0
		} else {
			quiet++
		}
	}
	t.Logf("stuck=%v: fed %d of %d batches of %d tokens; the reader got %d", stuck, fed, n, tokens, last-base)
	return last - base
}

// TestStuckSubscriberDelaysNoOther: beside a subscriber that never reads, a reading one
// gets at least half of what it gets alone for the same batches published.
func TestStuckSubscriberDelaysNoOther(t *testing.T) {
	const n, tokens = 600, 8192
	alone := stuckPhase(t, false, n, tokens)
	beside := stuckPhase(t, true, n, tokens)
	t.Logf("reader alone: %d of %d batches; beside a stuck subscriber: %d (ratio %.2f)", alone, n, beside, float64(beside)/float64(alone))
	if alone == 0 || 2*beside < alone {
		t.Fatalf("beside a stuck subscriber the reader got %d batches, alone %d: want at least half", beside, alone)
	}
}

// replayAll asks the replay socket for every batch from 0 on and returns the seqs it got
// before the end marker (nil when the answer does not come within d).
func replayAll(t *testing.T, c *zmtpPeer, d time.Duration) []uint64 {
	c.send(t, nil, make([]byte, 8))
	c.setDeadline(d)
	defer c.setDeadline(0)
	var seqs []uint64
	for {
		msg, err := c.recv()
		if err != nil {
			t.Logf("replay: %v after %d batches", err, len(seqs))
			return nil
		}
		if len(msg) != 3 || len(msg[0]) != 0 || len(msg[1]) != 8 {
			t.Fatalf("replay message of %d frames, want [empty, seq, payload]", len(msg))
		}
		seq := binary.BigEndian.Uint64(msg[1])
		if seq == ^uint64(0) {
			return seqs
		}
		seqs = append(seqs, seq)
	}
}

// TestStuckReplayClientDelaysNoOther: a replay client that asks for everything and never
// reads delays no other client's replay; the reply it cannot take is dropped and counted.
func TestStuckReplayClientDelaysNoOther(t *testing.T) {
	const n, tokens = 300, 8192
	ep, replayEp := freeTCP(t, "*"), freeTCP(t, "127.0.0.1")
	src := newStreamSource()
	p, err := Start(src, stuckReplayOptions(ep, replayEp))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if fed := src.feed(0, n, tokens, time.Now().Add(20*time.Second)); fed != n {
		t.Fatalf("fed %d of %d batches", fed, n)
	}
	// Every batch is in the history once a replay returns them all.
	probe := dialZMTP(t, replayEp, "DEALER", true)
	if !waitFor(20*time.Second, func() bool { return len(replayAll(t, probe, 10*time.Second)) == n }) {
		t.Fatal("the history never held every batch")
	}
	stuck := dialZMTPBuf(t, replayEp, "DEALER", true, 4096)
	stuck.send(t, nil, make([]byte, 8))
	time.Sleep(200 * time.Millisecond) // the server took the stuck client's request first
	for i := 0; i < 3; i++ {
		reader := dialZMTP(t, replayEp, "DEALER", true)
		if got := replayAll(t, reader, 20*time.Second); len(got) != n {
			t.Fatalf("replay %d beside a stuck client: %d batches, want %d", i, len(got), n)
		}
	}
	assertReplayCut(t, p)
}

// historyRun feeds n big batches to a publisher and returns it, all of them published.
func historyRun(t *testing.T, o Options, src *streamSource, first uint64, n, tokens int) {
	t.Helper()
	if fed := src.feed(first, n, tokens, time.Now().Add(60*time.Second)); fed != n {
		t.Fatalf("fed %d of %d batches", fed, n)
	}
}

func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
