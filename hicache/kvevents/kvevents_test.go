package kvevents

import (
	"encoding/binary"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cpcache/cpcache/hicache"
)

// fakeSource hands out the batches a test feeds, as a Cache would.
type fakeSource struct {
	mu   sync.Mutex
	all  []hicache.EventBatch
	ch   chan hicache.EventBatch
	next uint64
}

func (s *fakeSource) Subscribe(from uint64) (<-chan hicache.EventBatch, func(), error) {
	return s.ch, func() { close(s.ch) }, nil
}

func (s *fakeSource) EventsSince(seq uint64) ([]hicache.EventBatch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []hicache.EventBatch
	for _, b := range s.all {
		if b.Seq >= seq {
			out = append(out, b)
		}
	}
	return out, nil
}

func (s *fakeSource) NextEventSeq() (uint64, error) { return s.next, nil }

// add makes batch seq; live says whether the subscription gets it (else it was dropped).
func (s *fakeSource) add(seq uint64, live bool, evs ...hicache.Event) {
	b := hicache.EventBatch{Seq: seq, Time: time.Unix(1700000000, 0), Replica: 1, Events: evs}
	s.mu.Lock()
	s.all = append(s.all, b)
	s.next = seq + 1
	s.mu.Unlock()
	if live {
		s.ch <- b
	}
}

func stored(tier hicache.Tier, key string, parent uint64, hashes ...uint64) hicache.Event {
	return hicache.Event{Kind: hicache.EventStored, Tier: tier, Hashes: ids(hashes...), Parent: id(parent), HasParent: parent != 0,
		Tokens: make([]int32, 2*len(hashes)), Key: key}
}

// id is a page id standing for the small number n in these tests (n in its first bytes).
func id(n uint64) hicache.PageID {
	var p hicache.PageID
	binary.LittleEndian.PutUint64(p[:8], n)
	p[31] = 0xa5
	return p
}

func ids(ns ...uint64) []hicache.PageID {
	out := make([]hicache.PageID, len(ns))
	for i, n := range ns {
		out[i] = id(n)
	}
	return out
}

// bin is id(n) as msgpack decodes a bin: block hashes are 32-byte bins, as vLLM's SHA-256 ones.
func bin(n uint64) []byte { p := id(n); return p[:] }

// TestEncodeIsVLLMLayout decodes a payload generically and checks vLLM's array-like layout.
func TestEncodeIsVLLMLayout(t *testing.T) {
	b := hicache.EventBatch{Seq: 3, Time: time.Unix(1700000000, 500_000_000), Replica: 2, Events: []hicache.Event{
		stored(hicache.TierDevice, "", 0, 11, 12),
		stored(hicache.TierHost, "tenant", 12, 13),
		{Kind: hicache.EventRemoved, Tier: hicache.TierStorage, Hashes: ids(11)},
		{Kind: hicache.EventCleared},
	}}
	raw, err := Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	var got []any
	if err := msgpack.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := []any{1700000000.5, []any{
		[]any{"BlockStored", []any{bin(11), bin(12)}, nil, []any{int8(0), int8(0), int8(0), int8(0)}, int8(2), nil, "GPU", nil, nil},
		[]any{"BlockStored", []any{bin(13)}, bin(12), []any{int8(0), int8(0)}, int8(2), nil, "CPU", nil, []any{[]any{"tenant"}}},
		[]any{"BlockRemoved", []any{bin(11)}, "STORAGE"},
		[]any{"AllBlocksCleared"},
	}, int8(2)}
	if !reflect.DeepEqual(normalize(got), normalize(want)) {
		t.Fatalf("payload\n%#v\nwant\n%#v", got, want)
	}
}

// normalize maps every integer to int64 (msgpack picks the smallest encoding).
func normalize(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	return v
}

// TestPublisherFillsGapsAndReplays: batches the subscription dropped are fetched from the
// source's ring and sent in order; the replay socket answers [empty, seq] with every batch
// from seq on and the end marker.
func TestPublisherFillsGapsAndReplays(t *testing.T) {
	src := &fakeSource{ch: make(chan hicache.EventBatch, 16)}
	p, err := Start(src, Options{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://127.0.0.1:0", Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	src.add(0, true, stored(hicache.TierDevice, "", 0, 1))
	src.add(1, true, stored(hicache.TierDevice, "", 1, 2))
	src.add(2, false, stored(hicache.TierHost, "", 0, 1)) // dropped by the subscription
	src.add(3, false, hicache.Event{Kind: hicache.EventRemoved, Tier: hicache.TierDevice, Hashes: ids(2)})
	src.add(4, true, hicache.Event{Kind: hicache.EventCleared})

	_, replayEp := p.Endpoints()
	dealer := dialZMTP(t, replayEp, "DEALER", true)
	var got []uint64
	for attempt := 0; len(got) < 5; attempt++ {
		if attempt > 200 {
			t.Fatalf("replay returned %v, want 0..4", got)
		}
		got = replayAll(t, dealer, 10*time.Second)
		for _, seq := range got {
			if seq >= uint64(len(src.all)) {
				t.Fatalf("replayed batch %d, never made", seq)
			}
		}
		if len(got) < 5 {
			time.Sleep(5 * time.Millisecond) // the publisher has not sent them all yet
		}
	}
	if !reflect.DeepEqual(got, []uint64{0, 1, 2, 3, 4}) {
		t.Fatalf("replayed %v, want 0..4 in order (2 and 3 filled from the ring)", got)
	}
}

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		dp   int
		want string
	}{{"tcp://*:5557", 0, "tcp://*:5557"}, {"tcp://*:5557", 3, "tcp://*:5560"}, {"tcp://[::1]:7000", 1, "tcp://[::1]:7001"},
		{"inproc://ev", 2, "inproc://ev_dp2"}, {"tcp://*:65534", 1, "tcp://*:65535"}} {
		if got, err := OffsetEndpoint(tc.ep, tc.dp, true); err != nil || got != tc.want {
			t.Fatalf("OffsetEndpoint(%q, %d) = %q, %v; want %q", tc.ep, tc.dp, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		ep   string
		dp   int
		bind bool
		want string
	}{
		{"tcp://host", 1, false, `endpoint "tcp://host" has no port`},
		{"tcp://host", 0, false, `endpoint "tcp://host" has no port`},
		{"tcp://*:99999", 0, true, `endpoint "tcp://*:99999": port 99999 is out of range (0-65535)`},
		{"tcp://*:65535", 1, true, `endpoint "tcp://*:65535": replica 1 would use port 65536, above 65535`},
		{"bogus://x", 0, true, `endpoint "bogus://x": unknown scheme "bogus"`},
		{"5557", 0, true, `endpoint "5557": want tcp://HOST:PORT`},
		{"tcp://host:5558", 0, true, `endpoint "tcp://host:5558" is bound: host "host" is not *, an IP address or localhost`},
		{"tcp://a;b:5558", 0, false, `host "a;b" is not a host name`},
		{"tcp://:5558", 0, false, `endpoint "tcp://:5558" has no host`},
		{"tcp://*:x", 0, true, `port "x" is not a number`},
		{"tcp://::1:5557", 0, true, `write the IPv6 address in brackets`},
		{"tcp://127.0.0.1:0", 0, false, `port 0 can only be bound`},
		{"ipc://", 0, true, `endpoint "ipc://" has no path`},
		{"ipc:///tmp/" + strings.Repeat("x", 110), 0, true, "a Unix socket holds at most 107"},
		{"ipc:///tmp/ev", 1, true, `want tcp:// or inproc:// to offset for replica 1`},
	} {
		if _, err := OffsetEndpoint(tc.ep, tc.dp, tc.bind); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OffsetEndpoint(%q, %d, %v): %v, want %q", tc.ep, tc.dp, tc.bind, err, tc.want)
		}
	}
}
