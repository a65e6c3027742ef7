package kvevents

import (
	"context"
	"encoding/binary"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
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

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("test")))
	defer dealer.Close()
	if err := dealer.Dial("tcp://" + p.replay.Addr().String()); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for attempt := 0; len(got) < 5; attempt++ {
		if attempt > 200 {
			t.Fatalf("replay returned %v, want 0..4", got)
		}
		got = got[:0]
		var from [8]byte
		binary.BigEndian.PutUint64(from[:], 0)
		if err := dealer.SendMulti(zmq4.NewMsgFrom(nil, from[:])); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := dealer.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 {
				t.Fatalf("replay message %q, want [empty, seq, payload]", msg.Frames)
			}
			seq := binary.BigEndian.Uint64(msg.Frames[1])
			if seq == ^uint64(0) {
				break
			}
			want, _ := Encode(src.all[seq])
			if string(msg.Frames[2]) != string(want) {
				t.Fatalf("replayed batch %d is not its encoding", seq)
			}
			got = append(got, seq)
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
	}{{"tcp://*:5557", 0, "tcp://*:5557"}, {"tcp://*:5557", 3, "tcp://*:5560"}, {"tcp://[::1]:7000", 1, "tcp://[::1]:7001"}, {"inproc://ev", 2, "inproc://ev_dp2"}} {
		if got, err := OffsetEndpoint(tc.ep, tc.dp); err != nil || got != tc.want {
			t.Fatalf("OffsetEndpoint(%q, %d) = %q, %v; want %q", tc.ep, tc.dp, got, err, tc.want)
		}
	}
	if _, err := OffsetEndpoint("tcp://host", 1); err == nil || !strings.Contains(err.Error(), `"tcp://host"`) {
		t.Fatalf("no port: %v", err)
	}
}
