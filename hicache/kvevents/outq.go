package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// An outQueue stands between libzmq and one subscriber of a guarded PUB socket. Its reader
// takes everything libzmq sends for that subscriber at once (so libzmq's own queue stays
// short), cuts the ZMTP stream into whole units — the greeting, each command, each
// message with all its frames — and queues them; its writer sends them to the peer. The
// queue holds at most maxBytes (counting the message being read and those being written)
// and maxMsgs messages besides one being written (as libzmq's queue, whose connection holds
// the batch it is writing): a message that does not fit is dropped whole, so the stream the
// peer gets stays valid ZMTP, and counted. The one being written is not counted against
// maxMsgs because the peer may have all of it before the writer's write returns: a peer that
// takes each batch before the next is published has then none waiting, and must not lose
// the next at maxMsgs 1. A subscriber that does not read therefore holds at most maxBytes of the
// rank's memory (plus the reader's buffers) and loses its own batches; no other waits.
// Queues share the bytes of equal messages (msgPool): libzmq sends each subscriber the
// same bytes for a batch, so subscribers stuck at once hold one copy of it.
type outQueue struct {
	maxBytes int64
	maxMsgs  int
	pubStats *subscriberTotals // the publisher's totals
	pool     *msgPool

	mu      sync.Mutex
	wake    chan struct{} // signalled when units are queued or the queue closes
	units   []outUnit     // whole units, oldest first
	msgs    int           // messages among units
	writing int           // messages the writer is sending
	bytes   int64         // bytes of units plus the message being read
	closed  bool
	delvd   atomic.Uint64 // messages written to the peer
	dropped atomic.Uint64 // messages dropped: the queue was full
	recvd   atomic.Uint64 // messages libzmq sent for this subscriber
}

// An outUnit is a unit of the stream: a message (pooled) or the greeting or a command.
type outUnit struct {
	b []byte
	p *pooled // nil: not pooled
}

// subscriberTotals are the publisher's counters over every subscriber's outQueue.
type subscriberTotals struct {
	dropped atomic.Uint64
	queued  atomic.Int64 // bytes queued now, all queues (a shared message counted in each)
	held    atomic.Int64 // bytes of the distinct messages the queues hold
}

// A msgPool holds one copy of each message queued for subscribers, shared by every queue
// that holds an equal one (compared whole, not only by hash).
type msgPool struct {
	mu   sync.Mutex
	seed maphash.Seed
	m    map[uint64]*pooled
	held *atomic.Int64
}

type pooled struct {
	b    []byte
	key  uint64
	refs int
}

func newMsgPool(held *atomic.Int64) *msgPool {
	return &msgPool{seed: maphash.MakeSeed(), m: map[uint64]*pooled{}, held: held}
}

// get returns the pooled copy of msg, made if none is held; msg is not kept.
func (mp *msgPool) get(msg []byte) *pooled {
	key := maphash.Bytes(mp.seed, msg)
	mp.mu.Lock()
	defer mp.mu.Unlock()
	if p := mp.m[key]; p != nil && bytes.Equal(p.b, msg) {
		p.refs++
		return p
	}
	p := &pooled{b: bytes.Clone(msg), key: key, refs: 1}
	if mp.m[key] == nil { // else a different message of the same hash: kept apart
		mp.m[key] = p
	}
	mp.held.Add(int64(len(p.b)))
	return p
}

// put drops a reference to p.
func (mp *msgPool) put(p *pooled) {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	if p.refs--; p.refs == 0 {
		if mp.m[p.key] == p {
			delete(mp.m, p.key)
		}
		mp.held.Add(-int64(len(p.b)))
	}
}

// SubscriberStats describes one subscriber connection of a bound PUB socket.
type SubscriberStats struct {
	// Conn numbers the connection (from 1, per socket); Remote is the peer's address.
	Conn   uint64
	Remote string
	// Received: batches libzmq handed on for this subscriber (those it subscribed to);
	// Delivered: batches written to its connection; Dropped: batches dropped because its
	// queue was full (Options.SubscriberQueueBytes or SendHWM). Received = Delivered +
	// Dropped + QueuedBatches.
	Received, Delivered, Dropped uint64
	// QueuedBatches and QueuedBytes: what its queue holds now, what is being written to the
	// connection included (bytes also include a batch being read from libzmq).
	QueuedBatches int
	QueuedBytes   int64
}

func newOutQueue(maxBytes int64, maxMsgs int, totals *subscriberTotals, pool *msgPool) *outQueue {
	return &outQueue{maxBytes: maxBytes, maxMsgs: maxMsgs, pubStats: totals, pool: pool, wake: make(chan struct{}, 1)}
}

func (q *outQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// reserve counts n more bytes of the message being read; false (nothing counted) when the
// queue has no room for them.
func (q *outQueue) reserve(n uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || n > uint64(q.maxBytes) || q.bytes+int64(n) > q.maxBytes {
		return false
	}
	q.bytes += int64(n)
	q.pubStats.queued.Add(int64(n))
	return true
}

// release uncounts n reserved bytes (a message dropped after part of it was reserved).
func (q *outQueue) release(n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return // close uncounted everything
	}
	q.bytes -= n
	q.pubStats.queued.Add(-n)
}

// push queues a unit whose bytes are reserved; a message (taken from the pool; unit is
// not kept) past maxMsgs, one being written aside, is dropped (false).
func (q *outQueue) push(unit []byte, message bool) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	if message && q.msgs+max(q.writing-1, 0) >= q.maxMsgs {
		q.mu.Unlock()
		q.release(int64(len(unit)))
		return false
	}
	u := outUnit{b: unit}
	if message {
		u.p = q.pool.get(unit)
		u.b = u.p.b
		q.msgs++
	}
	q.units = append(q.units, u)
	q.mu.Unlock()
	q.signal()
	return true
}

// unpool drops the pool's references of units.
func (q *outQueue) unpool(units []outUnit) {
	for _, u := range units {
		if u.p != nil {
			q.pool.put(u.p)
		}
	}
}

// close ends the writer and uncounts what is left.
func (q *outQueue) close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	left, units := q.bytes, q.units
	q.bytes, q.units, q.msgs = 0, nil, 0
	q.mu.Unlock()
	q.pubStats.queued.Add(-left)
	q.unpool(units)
	q.signal()
}

// stats is the queue's line of Publisher.Subscribers.
func (q *outQueue) stats(conn uint64, remote string) SubscriberStats {
	q.mu.Lock()
	n, b := q.msgs+q.writing, q.bytes
	q.mu.Unlock()
	return SubscriberStats{Conn: conn, Remote: remote, Received: q.recvd.Load(), Delivered: q.delvd.Load(),
		Dropped: q.dropped.Load(), QueuedBatches: n, QueuedBytes: b}
}

// write sends the queued units to peer until the queue closes or a write fails.
func (q *outQueue) write(peer net.Conn) error {
	for {
		q.mu.Lock()
		for len(q.units) == 0 && !q.closed {
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if q.closed {
			q.mu.Unlock()
			return nil
		}
		units, msgs := q.units, q.msgs
		q.units, q.msgs, q.writing = nil, 0, msgs
		q.mu.Unlock()
		var n int64
		bufs := make(net.Buffers, len(units))
		for i, u := range units {
			n += int64(len(u.b))
			bufs[i] = u.b
		}
		_, err := bufs.WriteTo(peer)
		q.unpool(units)
		q.mu.Lock()
		if !q.closed {
			q.bytes -= n
			q.pubStats.queued.Add(-n)
		}
		q.writing = 0
		if err == nil {
			q.delvd.Add(uint64(msgs))
		}
		q.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// read takes libzmq's stream for this subscriber from src and queues it until src ends or
// breaks ZMTP.
func (q *outQueue) read(src io.Reader) error {
	sp := &streamSplitter{q: q}
	defer sp.abandon()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if ferr := sp.feed(buf[:n]); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			return err
		}
	}
}

// streamSplitter cuts the ZMTP 3 stream libzmq sends into the units of an outQueue: the
// 64-byte greeting, each command frame, each message (its frames up to the one without
// the more flag). libzmq is trusted, but no length is allocated before it is reserved in
// the queue: a frame that cannot fit is skipped, never buffered.
type streamSplitter struct {
	q        *outQueue
	greeting bool // the greeting is queued
	state    int  // stateFlags, stateSize or stateBody
	flags    byte // of the frame being read
	size     [8]byte
	sizeN    int
	left     uint64 // body bytes left
	unit     []byte // the unit being read; nil while a message is being dropped
	scratch  []byte // kept for the next message (the pool copies each message)
	inMsg    bool   // a message has begun
	dropping bool   // the message being read is dropped
	reserved int64  // bytes reserved for the unit being read
}

// abandon releases what the unit being read reserved (the stream ended).
func (s *streamSplitter) abandon() {
	if s.reserved > 0 {
		s.q.release(s.reserved)
		s.reserved = 0
	}
}

func (s *streamSplitter) feed(b []byte) error {
	q := s.q
	for len(b) > 0 {
		if !s.greeting {
			if s.unit == nil {
				if !q.reserve(64) {
					return fmt.Errorf("kvevents: a subscriber queue of %d bytes cannot hold the greeting", q.maxBytes)
				}
				s.unit, s.reserved = make([]byte, 0, 64), 64
			}
			k := min(len(b), 64-len(s.unit))
			s.unit = append(s.unit, b[:k]...)
			b = b[k:]
			if len(s.unit) == 64 {
				q.push(s.unit, false)
				s.unit, s.reserved, s.greeting = nil, 0, true
			}
			continue
		}
		switch s.state {
		case stateFlags:
			s.flags = b[0]
			b = b[1:]
			if s.flags&^0x07 != 0 || s.flags&0x05 == 0x05 {
				return fmt.Errorf("kvevents: libzmq sent frame flags %#x", s.flags)
			}
			if s.flags&0x04 != 0 && s.inMsg {
				return fmt.Errorf("kvevents: libzmq sent a command inside a message")
			}
			s.sizeN, s.state = 0, stateSize
		case stateSize:
			need := 1
			if s.flags&0x02 != 0 {
				need = 8
			}
			s.size[s.sizeN] = b[0]
			s.sizeN++
			b = b[1:]
			if s.sizeN < need {
				continue
			}
			s.left = uint64(s.size[0])
			if need == 8 {
				s.left = binary.BigEndian.Uint64(s.size[:])
			}
			frame := uint64(1+need) + s.left
			switch {
			case s.flags&0x04 != 0: // a command: passed whole, never dropped
				if !q.reserve(frame) {
					return fmt.Errorf("kvevents: libzmq sent a command of %d bytes (subscriber queue %d bytes)", s.left, q.maxBytes)
				}
				s.unit, s.reserved = make([]byte, 0, frame), int64(frame)
			case s.dropping:
			case !q.reserve(frame): // the message does not fit: dropped whole
				s.abandon()
				s.unit, s.dropping = nil, true
			default:
				if s.unit == nil {
					s.unit = s.scratch[:0]
				}
				if s.unit == nil {
					s.unit = make([]byte, 0, frame)
				}
				s.reserved += int64(frame)
			}
			s.inMsg = s.flags&0x04 == 0
			if s.unit != nil {
				s.unit = append(append(s.unit, s.flags), s.size[:need]...)
			}
			s.state = stateBody
			if s.left == 0 {
				s.endFrame()
			}
		case stateBody:
			k := uint64(len(b))
			if k > s.left {
				k = s.left
			}
			if s.unit != nil {
				s.unit = append(s.unit, b[:k]...)
			}
			b = b[k:]
			s.left -= k
			if s.left == 0 {
				s.endFrame()
			}
		}
	}
	return nil
}

// maxScratch is the largest message buffer a splitter keeps between messages.
const maxScratch = 256 << 10

// endFrame ends a frame: a command is queued as it is; the last frame of a message ends
// the message, queued unless it is dropped (it did not fit, or the queue holds maxMsgs).
func (s *streamSplitter) endFrame() {
	q := s.q
	s.state = stateFlags
	switch {
	case s.flags&0x04 != 0:
		q.push(s.unit, false)
	case s.flags&0x01 != 0:
		return // more frames follow
	default:
		q.recvd.Add(1)
		if s.dropping || !q.push(s.unit, true) {
			q.dropped.Add(1)
			q.pubStats.dropped.Add(1)
		}
		if s.unit != nil && cap(s.unit) <= maxScratch {
			s.scratch = s.unit[:0]
		}
		s.inMsg, s.dropping = false, false
	}
	s.unit, s.reserved = nil, 0
}
