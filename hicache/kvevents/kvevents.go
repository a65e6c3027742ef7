// Package kvevents publishes a cpcache replica's KV events (hicache.Cache.Subscribe) in the
// wire format vLLM's ZmqEventPublisher uses, so that a KV-aware router written for vLLM
// (Dynamo's KV router, llm-d's) can follow what each replica holds:
//
//   - a ZMQ PUB socket sends each batch as a multipart message [topic, seq, payload]: seq is
//     the batch's Seq as 8 bytes big-endian, payload a msgpack KVEventBatch;
//   - a ZMQ ROUTER socket (ReplayEndpoint) answers a request [empty, start seq (8 bytes
//     big-endian)] from a DEALER or REQ client with [empty, seq, payload] for every batch
//     from start seq on that the history still holds, then [empty, -1 (8 bytes), empty].
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
// The sockets are libzmq's (package zmq, loaded at run time: Start fails with a
// *zmq.LoadError naming libzmq.so.5 and Debian's libzmq5 when it is missing), set so that no
// peer can crash, stall or bloat the publishing rank:
//
//   - a bound tcp:// or ipc:// endpoint is the publisher's own listener, which joins each
//     connection to the libzmq socket's private ipc:// endpoint and reads what the peer
//     sends as the ZMTP 3 stream it must be: a frame declaring more than
//     Options.MaxMessageBytes (64 KiB; up to 2^62 bytes), a message of more than 4 frames
//     or more than that in all, or a stream that is not ZMTP 3 cuts the connection before
//     libzmq reads it (Stats.Cut), as is a peer that has not finished its handshake within
//     10 s and, on the PUB socket, a peer past 64 subscriptions (libzmq keeps each in a trie
//     while the connection lasts) or a frame over 256 bytes after its handshake; it holds
//     at most 256 connections at once, 32 of them from one IP address. libzmq bounds
//     frames itself (ZMQ_MAXMSGSIZE, also set, and the only bound on a PUB that connects to
//     a subscriber) but holds every frame of a message until its last: without the
//     listener, a peer sending an endless message grows the rank's memory as fast as it
//     sends. Stats.Accepted, Disconnected and HandshakeFailed count what libzmq's socket
//     monitor reports.
//   - on a bound PUB socket the listener also takes what libzmq sends each subscriber at
//     once and queues it per connection, as whole messages, in a queue bounded in bytes
//     (Options.SubscriberQueueBytes, 4 MiB) and in batches (Options.SendHWM, 1000), written
//     to the subscriber by its own goroutine: a batch that does not fit is dropped whole for
//     that subscriber alone (the stream stays valid ZMTP), counted (Stats.SubscriberDropped,
//     per connection Publisher.Subscribers); it sees the gap in seq and may replay. No
//     other subscriber waits, and the memory is bounded: per connection at most
//     SubscriberQueueBytes plus 320 KiB of buffers (a 32 KiB read buffer each way and the
//     batch being read, kept up to 256 KiB), at most 256 connections: about 1.1 GiB at
//     worst, reached only by subscribers stuck at different times, since queues share the
//     bytes of equal batches (subscribers stuck at once hold one copy, Stats.
//     SubscriberHeldBytes), plus the kernel's socket buffers. libzmq's own queue (SendHWM)
//     stays short. A PUB that connects to a subscriber has libzmq's SendHWM only, whose
//     drops are silent (libzmq's drop counter is a draft API, not in Debian's build);
//     Stats.SendFailed counts only what the PUB socket itself refused.
//   - the replay ROUTER sets ZMQ_ROUTER_MANDATORY and sends without blocking: replies take
//     turns, each client's queue holds Options.ReplayHWM messages, a client whose queue
//     stays full for Options.ReplayTimeout loses the rest of its reply (Stats.ReplayCut),
//     and a request that is not [empty, 8-byte seq] is ignored (Stats.ReplayBadRequests).
//     A reply ends with the batches published when its request came. The listener copies
//     replies through as is (a client that does not read fills its own connection, then its
//     ReplayHWM queue): a replay client holds at most ReplayHWM (64) batches in libzmq,
//     bounded in messages, not bytes, plus the kernel's socket buffers.
//   - the replay history is bounded in encoded bytes (Options.HistoryBytes, 64 MiB) and
//     kept only with a ReplayEndpoint.
//
// Endpoints are tcp://HOST:PORT, ipc://PATH or inproc://NAME; CheckEndpoint and
// OffsetEndpoint say what is wrong with one before anything starts.
//
// The package is kept apart from the cache (the core and the hicache driver depend on no
// ZMQ or msgpack code). Config and StartReplica are the one way it is wired in: by job.Open
// (job.Config.KVEvents), and through it by `cpcache run --kv-events` and libcpcache
// (cpcache_config.kv_events_endpoint, Python's Cache(kv_events=...)).
package kvevents

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cpcache/cpcache/hicache"
)

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
