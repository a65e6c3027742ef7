package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cpcache/cpcache/zmq"
)

// endSeq ends a replay: -1 as 8 bytes big-endian.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replayReply is a reply in progress: the batches from next on, before end (the batches
// published when the request came), then the end marker.
type replayReply struct {
	id        []byte
	next, end uint64
	full      time.Time // since when the client's queue is full (zero: it is not)
}

// replayBudget is how many messages one reply may queue before the next reply's turn.
const replayBudget = 16

// serveReplay answers replay requests until Close. It never waits on a client: every send
// is non-blocking (ZMQ_DONTWAIT with ZMQ_ROUTER_MANDATORY, so a full queue is EAGAIN, not a
// silent drop), replies take turns, and a client whose queue stays full for ReplayTimeout
// loses the rest of its reply.
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	var replies []*replayReply
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		timeout := 100
		if len(replies) > 0 {
			timeout = 2
		}
		items := []zmq.PollItem{{Socket: p.replay, Events: zmq.PollIn}}
		if len(replies) >= p.opts.MaxReplayClients {
			items = nil // further requests wait in their queues
		}
		if items != nil {
			if _, err := zmq.Poll(items, timeout); err != nil && err != zmq.EINTR {
				p.logf(fmt.Errorf("kvevents: replay poll: %w", err))
				return
			}
		} else {
			time.Sleep(time.Duration(timeout) * time.Millisecond)
		}
		for n := 0; items != nil && items[0].Ready&zmq.PollIn != 0 && n < 64 && len(replies) < p.opts.MaxReplayClients; n++ {
			r, err := p.request()
			if errors.Is(err, zmq.EAGAIN) {
				break
			}
			if err != nil {
				p.logf(err)
				continue
			}
			replies = addReply(replies, r)
		}
		replies = p.serveReplies(replies)
	}
}

// request reads one request: [identity, empty, 8-byte seq] (a DEALER's or a REQ's).
func (p *Publisher) request() (*replayReply, error) {
	frames, dropped, err := p.replay.Recv(zmq.DontWait, 3)
	if err != nil {
		return nil, err
	}
	if dropped > 0 || len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		p.replayBad.Add(1)
		return nil, fmt.Errorf("kvevents: replay request of %d frames, want [empty, 8-byte seq]", len(frames)+dropped-1)
	}
	p.replayRequests.Add(1)
	return &replayReply{id: frames[0], next: binary.BigEndian.Uint64(frames[2]), end: p.hist.endSeq()}, nil
}

// addReply adds r, replacing a reply in progress to the same client.
func addReply(replies []*replayReply, r *replayReply) []*replayReply {
	for i, old := range replies {
		if string(old.id) == string(r.id) {
			replies[i] = r
			return replies
		}
	}
	return append(replies, r)
}

// serveReplies queues up to replayBudget messages of each reply and returns the replies
// not finished.
func (p *Publisher) serveReplies(replies []*replayReply) []*replayReply {
	kept := replies[:0]
	now := time.Now()
	for _, r := range replies {
		done, cut := p.serveOne(r, now)
		if cut {
			p.replayCut.Add(1)
		}
		if !done && !cut {
			kept = append(kept, r)
		}
	}
	for i := len(kept); i < len(replies); i++ {
		replies[i] = nil
	}
	return kept
}

func (p *Publisher) serveOne(r *replayReply, now time.Time) (done, cut bool) {
	for i := 0; i < replayBudget; i++ {
		b, ok := p.hist.next(r.next, r.end)
		var err error
		if ok {
			var seq [8]byte
			binary.BigEndian.PutUint64(seq[:], b.seq)
			err = p.replay.Send(zmq.DontWait, r.id, nil, seq[:], b.payload)
		} else {
			err = p.replay.Send(zmq.DontWait, r.id, nil, endSeq, nil)
		}
		switch {
		case err == nil:
			r.full = time.Time{}
			if !ok {
				return true, false
			}
			p.replaySent.Add(1)
			r.next = b.seq + 1
		case errors.Is(err, zmq.EAGAIN):
			if r.full.IsZero() {
				r.full = now
			}
			return false, now.Sub(r.full) > p.opts.ReplayTimeout
		default: // EHOSTUNREACH: the client left
			return false, true
		}
	}
	return false, false
}
