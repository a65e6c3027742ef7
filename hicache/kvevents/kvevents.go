// Package kvevents publishes a cpcache replica's KV events (hicache.Cache.Subscribe) in the
// wire format vLLM's ZmqEventPublisher uses, so that a KV-aware router written for vLLM
// (Dynamo's KV router, llm-d's) can follow what each replica holds:
//
//   - a ZMQ PUB socket sends each batch as a multipart message [topic, seq, payload]: seq is
//     the batch's Seq as 8 bytes big-endian, payload a msgpack KVEventBatch;
//   - a ZMQ ROUTER socket (ReplayEndpoint) answers a request [empty, start seq (8 bytes
//     big-endian)] from a DEALER or REQ client with [empty, seq, payload] for every batch
//     from start seq on that the ring still holds, then [empty, -1 (8 bytes), empty].
//
// The msgpack payload is array-like, as vLLM encodes its msgspec structs (array_like=True,
// tag=True: an event is an array whose first element is its type name):
//
//	KVEventBatch:     [ts (float64 seconds since the epoch), [event...], data_parallel_rank]
//	BlockStored:      ["BlockStored", block_hashes, parent_block_hash (nil for the first
//	                   page of a sequence), token_ids, block_size, lora_id (nil), medium,
//	                   lora_name (nil), extra_keys]
//	BlockRemoved:     ["BlockRemoved", block_hashes, medium]
//	AllBlocksCleared: ["AllBlocksCleared"]
//
// block_hashes are cpcache's page ids: each the 32-byte SHA-256 chained over the page's
// prefix and its isolation key (hicache/core/hash.go; storage keys derive from it), encoded
// as msgpack bin 8 of 32 bytes, as vLLM's ExternalBlockHash (bytes | int) and its own
// SHA-256 block hashes are; parent_block_hash likewise. A block is
// a cache page (block_size = page tokens), medium is "GPU" for the device tier (L1), "CPU"
// for the host tier (L2) and "STORAGE" for storage (L3). extra_keys is nil under the empty
// isolation key, else one entry per block, [key] (a str when the key is UTF-8, else bin):
// equal tokens under different keys have different hashes. Decoders of vLLM's older
// five-field BlockStored ignore the trailing fields.
//
// The package is kept apart from the cache (the core and the hicache driver depend on no
// ZMQ or msgpack code): the runner (cpcache run --kv-events) or an engine wires it in.
package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cpcache/cpcache/hicache"
)

// Options configures a Publisher.
type Options struct {
	// Endpoint is the PUB socket's address: bound when it is a wildcard ("tcp://*:5557",
	// "tcp://[::]:5557") or ipc://, else connected to (a subscriber that binds), as vLLM
	// does.
	Endpoint string
	// ReplayEndpoint is the ROUTER socket's address (always bound); "" for none.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" by default, as vLLM's).
	Topic string
	// Log receives errors of the background loop (nil: dropped).
	Log func(error)
	// Linger is how long Close keeps the sockets open after the last batch was queued, for
	// ZMQ to deliver it and for late replay requests (default 1s; negative: none).
	Linger time.Duration
}

// Source is what a Publisher reads: a hicache.Cache that publishes events.
type Source interface {
	Subscribe(fromSeq uint64) (<-chan hicache.EventBatch, func(), error)
	EventsSince(seq uint64) ([]hicache.EventBatch, error)
	NextEventSeq() (uint64, error)
}

// Publisher sends a cache's event batches on ZMQ until Close.
type Publisher struct {
	src    Source
	opts   Options
	pub    zmq4.Socket
	replay zmq4.Socket // nil without ReplayEndpoint
	cancel func()
	stop   context.CancelFunc
	wg     sync.WaitGroup // serveReplay
	ran    chan struct{}  // closed when run returns

	mu   sync.Mutex // guards sent
	sent []sentBatch
}

type sentBatch struct {
	seq     uint64
	payload []byte
}

// replayRing is how many encoded batches the replay socket keeps (vLLM's default).
const replayRing = 10000

// Start opens the sockets and publishes src's batches, from its first one (or, when that
// has left its ring, from its next one), in a background goroutine until Close.
func Start(src Source, o Options) (*Publisher, error) {
	if o.Endpoint == "" {
		return nil, errors.New("kvevents: no endpoint")
	}
	ctx, stop := context.WithCancel(context.Background())
	if o.Linger == 0 {
		o.Linger = time.Second
	}
	p := &Publisher{src: src, opts: o, stop: stop, pub: zmq4.NewPub(ctx), ran: make(chan struct{})}
	fail := func(err error) (*Publisher, error) {
		p.closeSockets()
		stop()
		return nil, err
	}
	if bindable(o.Endpoint) {
		if err := p.pub.Listen(o.Endpoint); err != nil {
			return fail(fmt.Errorf("kvevents: listen on endpoint %q: %w", o.Endpoint, err))
		}
	} else if err := p.pub.Dial(o.Endpoint); err != nil {
		return fail(fmt.Errorf("kvevents: dial endpoint %q: %w", o.Endpoint, err))
	}
	if o.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("cpcache-replay")))
		if err := p.replay.Listen(o.ReplayEndpoint); err != nil {
			return fail(fmt.Errorf("kvevents: listen on replay endpoint %q: %w", o.ReplayEndpoint, err))
		}
	}
	ch, cancel, err := src.Subscribe(0)
	if errors.Is(err, hicache.ErrEventsGone) {
		// Started late: the first batches left the ring; publish from the next one.
		var next uint64
		if next, err = src.NextEventSeq(); err == nil {
			ch, cancel, err = src.Subscribe(next)
		}
	}
	if err != nil {
		return fail(fmt.Errorf("kvevents: %w", err))
	}
	p.cancel = cancel
	go p.run(ch)
	if p.replay != nil {
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

func bindable(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

func (p *Publisher) logf(err error) {
	if p.opts.Log != nil {
		p.opts.Log(err)
	}
}

// run sends every batch in Seq order; a gap (the subscription's channel overflowed) is
// filled from the cache's ring while it holds the batches, else left (subscribers see it in
// seq and may ask the replay socket).
func (p *Publisher) run(ch <-chan hicache.EventBatch) {
	defer close(p.ran)
	var next uint64
	first := true
	for b := range ch {
		if !first && b.Seq > next {
			missed, err := p.src.EventsSince(next)
			if err != nil {
				p.logf(fmt.Errorf("kvevents: batches %d..%d lost: %w", next, b.Seq-1, err))
			}
			for _, m := range missed {
				if m.Seq < b.Seq {
					p.send(m)
				}
			}
		}
		if first || b.Seq >= next {
			p.send(b)
			next, first = b.Seq+1, false
		}
	}
}

func (p *Publisher) send(b hicache.EventBatch) {
	payload, err := Encode(b)
	if err != nil {
		p.logf(fmt.Errorf("kvevents: encoding batch %d: %w", b.Seq, err))
		return
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], b.Seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.opts.Topic), seq[:], payload)); err != nil {
		p.logf(fmt.Errorf("kvevents: sending batch %d: %w", b.Seq, err))
	}
	p.mu.Lock()
	p.sent = append(p.sent, sentBatch{b.Seq, payload})
	if len(p.sent) > replayRing {
		p.sent = append(p.sent[:0], p.sent[len(p.sent)-replayRing:]...)
	}
	p.mu.Unlock()
}

// endSeq ends a replay: -1 as 8 bytes big-endian.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return // closed
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			p.logf(fmt.Errorf("kvevents: replay request of %d frames, want [identity, empty, 8-byte seq]", len(msg.Frames)))
			continue
		}
		id, from := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var out []sentBatch
		for _, s := range p.sent {
			if s.seq >= from {
				out = append(out, s)
			}
		}
		p.mu.Unlock()
		for _, s := range out {
			var seq [8]byte
			binary.BigEndian.PutUint64(seq[:], s.seq)
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, seq[:], s.payload)); err != nil {
				p.logf(fmt.Errorf("kvevents: replay of batch %d: %w", s.seq, err))
				break
			}
		}
		if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil)); err != nil {
			p.logf(fmt.Errorf("kvevents: replay end: %w", err))
		}
	}
}

func (p *Publisher) closeSockets() {
	if p.pub != nil {
		p.pub.Close()
	}
	if p.replay != nil {
		p.replay.Close()
	}
}

// Close stops publishing: the batches already made are sent, the sockets stay open for
// Options.Linger, then close. Call it after the cache's last Step. Idempotent.
func (p *Publisher) Close() error {
	if p == nil || p.cancel == nil {
		return nil
	}
	p.cancel() // closes the subscription's channel: run sends what it holds and returns
	p.cancel = nil
	<-p.ran
	if p.opts.Linger > 0 {
		time.Sleep(p.opts.Linger)
	}
	p.stop()
	p.closeSockets()
	p.wg.Wait()
	return nil
}

// Medium names a tier as vLLM's events do.
func Medium(t hicache.Tier) string {
	switch t {
	case hicache.TierDevice:
		return "GPU"
	case hicache.TierHost:
		return "CPU"
	}
	return "STORAGE"
}

// Encode is the msgpack payload of one batch (see the package doc).
func Encode(b hicache.EventBatch) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	enc := &encoder{e: e}
	enc.arr(3)
	enc.do(e.EncodeFloat64(float64(b.Time.UnixNano()) / 1e9))
	enc.arr(len(b.Events))
	for _, ev := range b.Events {
		switch ev.Kind {
		case hicache.EventStored:
			enc.arr(9)
			enc.do(e.EncodeString("BlockStored"))
			enc.hashes(ev.Hashes)
			if ev.HasParent {
				enc.do(e.EncodeBytes(ev.Parent[:]))
			} else {
				enc.do(e.EncodeNil())
			}
			enc.arr(len(ev.Tokens))
			for _, t := range ev.Tokens {
				enc.do(e.EncodeInt(int64(t)))
			}
			pageTokens := 0
			if len(ev.Hashes) > 0 {
				pageTokens = len(ev.Tokens) / len(ev.Hashes)
			}
			enc.do(e.EncodeInt(int64(pageTokens)))
			enc.do(e.EncodeNil()) // lora_id
			enc.do(e.EncodeString(Medium(ev.Tier)))
			enc.do(e.EncodeNil()) // lora_name
			if ev.Key == "" {
				enc.do(e.EncodeNil())
			} else {
				enc.arr(len(ev.Hashes))
				for range ev.Hashes {
					enc.arr(1)
					if utf8.ValidString(ev.Key) {
						enc.do(e.EncodeString(ev.Key))
					} else {
						enc.do(e.EncodeBytes([]byte(ev.Key)))
					}
				}
			}
		case hicache.EventRemoved:
			enc.arr(3)
			enc.do(e.EncodeString("BlockRemoved"))
			enc.hashes(ev.Hashes)
			enc.do(e.EncodeString(Medium(ev.Tier)))
		case hicache.EventCleared:
			enc.arr(1)
			enc.do(e.EncodeString("AllBlocksCleared"))
		default:
			return nil, fmt.Errorf("kvevents: event kind %d", ev.Kind)
		}
	}
	enc.do(e.EncodeInt(int64(b.Replica)))
	return buf.Bytes(), enc.err
}

// encoder keeps the first error of a sequence of msgpack writes.
type encoder struct {
	e   *msgpack.Encoder
	err error
}

func (x *encoder) do(err error) {
	if x.err == nil {
		x.err = err
	}
}

func (x *encoder) arr(n int) { x.do(x.e.EncodeArrayLen(n)) }

func (x *encoder) hashes(hs []hicache.PageID) {
	x.arr(len(hs))
	for _, h := range hs {
		x.do(x.e.EncodeBytes(h[:]))
	}
}

// OffsetEndpoint is the endpoint of DP replica dp, as vLLM numbers them: a tcp:// port plus
// dp, an inproc:// name with "_dp<dp>" appended; replica 0 keeps ep.
func OffsetEndpoint(ep string, dp int) (string, error) {
	if ep == "" || dp == 0 {
		return ep, nil
	}
	switch {
	case strings.HasPrefix(ep, "inproc://"):
		return fmt.Sprintf("%s_dp%d", ep, dp), nil
	case strings.HasPrefix(ep, "tcp://"):
		i := strings.LastIndex(ep, ":")
		port, err := strconv.Atoi(ep[i+1:])
		if err != nil || i < len("tcp://") {
			return "", fmt.Errorf("kvevents: endpoint %q has no port to offset for replica %d", ep, dp)
		}
		return fmt.Sprintf("%s:%d", ep[:i], port+dp), nil
	}
	return "", fmt.Errorf("kvevents: endpoint %q: want tcp:// or inproc:// to offset for replica %d", ep, dp)
}
