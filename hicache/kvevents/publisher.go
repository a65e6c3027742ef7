package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/zmq"
)

// Defaults of Options.
const (
	DefaultMaxMessageBytes = 64 << 10
	DefaultSendHWM         = 1000
	DefaultSubscriberQueue = 4 << 20
	// MinSubscriberQueue is the least Options.SubscriberQueueBytes: the handshake (the
	// greeting and libzmq's READY command) passes through the queue.
	MinSubscriberQueue      = 4 << 10
	DefaultHistoryBytes     = 64 << 20
	DefaultReplayHWM        = 64
	DefaultReplayTimeout    = 5 * time.Second
	DefaultMaxReplayClients = 64
)

// Options configures a Publisher.
type Options struct {
	// Endpoint is the PUB socket's address: bound when it is a wildcard ("tcp://*:5557",
	// "tcp://[::]:5557") or ipc://, else connected to (a subscriber that binds), as vLLM
	// does (see Bindable and CheckEndpoint).
	Endpoint string
	// ReplayEndpoint is the ROUTER socket's address (always bound); "" for none, and then
	// no history is kept.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" by default, as vLLM's).
	Topic string
	// Log receives errors of the background loops (nil: dropped).
	Log func(error)
	// Linger is how long Close keeps the sockets open after the last batch was queued, for
	// ZMQ to deliver it and for late replay requests (default 1s; negative: none).
	Linger time.Duration
	// MaxMessageBytes bounds what a peer may send in one message (default 64 KiB): a frame
	// declaring more (a subscription, a replay request, a handshake command), or a message
	// of more in all or of more than 4 frames, cuts its connection before anything of that
	// size is allocated (see the package doc). Subscriptions and requests are a few bytes.
	MaxMessageBytes int64
	// SendHWM is each subscriber's queue on the PUB socket in batches (default 1000; also
	// libzmq's ZMQ_SNDHWM), besides the batch being written to its connection: past it that
	// subscriber loses batches (it sees a gap in seq and asks the replay socket); no other
	// subscriber waits for it. A subscriber that takes each batch before the next one is
	// published loses none, whatever SendHWM.
	SendHWM int
	// SubscriberQueueBytes bounds each subscriber's queue on a bound tcp:// or ipc:// PUB
	// socket in bytes (default 4 MiB, at least MinSubscriberQueue): the publisher's
	// listener takes each batch from libzmq at once and queues it for that subscriber's
	// connection; a batch that does not fit (or past SendHWM batches waiting) is dropped
	// whole for that subscriber alone, counted (Stats.SubscriberDropped, Subscribers). A
	// batch larger than the bound reaches no subscriber (each sees the gap and may replay
	// it). Memory per
	// subscriber that does not read is at most this plus 320 KiB of buffers, and a batch
	// queued for several subscribers is held once. A PUB that connects to a subscriber
	// (not bound) has libzmq's SendHWM only.
	SubscriberQueueBytes int64
	// HistoryBytes bounds the batches kept for replay, in encoded bytes (default 64 MiB):
	// the oldest leave first. Without ReplayEndpoint nothing is kept.
	HistoryBytes int64
	// ReplayHWM is each replay client's queue in messages (default 64); the reply is sent
	// as the client takes it.
	ReplayHWM int
	// ReplayTimeout is how long a replay client's queue may stay full (it reads nothing)
	// before the rest of its reply is dropped and counted (default 5s).
	ReplayTimeout time.Duration
	// MaxReplayClients is how many replies are sent at once (default 64); further requests
	// wait in ZMQ's queues (each client's bounded by ReplayHWM) until one ends.
	MaxReplayClients int
}

func (o *Options) defaults() {
	if o.Linger == 0 {
		o.Linger = time.Second
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.SendHWM <= 0 {
		o.SendHWM = DefaultSendHWM
	}
	if o.SubscriberQueueBytes <= 0 {
		o.SubscriberQueueBytes = DefaultSubscriberQueue
	}
	if o.HistoryBytes <= 0 {
		o.HistoryBytes = DefaultHistoryBytes
	}
	if o.ReplayEndpoint == "" {
		o.HistoryBytes = 0
	}
	if o.ReplayHWM <= 0 {
		o.ReplayHWM = DefaultReplayHWM
	}
	if o.ReplayTimeout <= 0 {
		o.ReplayTimeout = DefaultReplayTimeout
	}
	if o.MaxReplayClients <= 0 {
		o.MaxReplayClients = DefaultMaxReplayClients
	}
}

// Stats counts what a Publisher did. The counters only grow, except the History ones.
type Stats struct {
	// Published: batches the PUB socket took. On a bound tcp:// or ipc:// socket each
	// subscriber then has its own queue (SubscriberQueueBytes, SendHWM): a batch that does
	// not fit there is dropped for that subscriber, counted in SubscriberDropped (and per
	// subscriber, Publisher.Subscribers). A PUB that connects to a subscriber has libzmq's
	// queue (SendHWM) alone, which drops silently (its drop counter is a draft API, not in
	// Debian's libzmq 4.3). Either way the subscriber sees the gap in seq and may replay.
	Published uint64
	// SubscriberDropped: batches dropped for a subscriber whose queue was full, summed over
	// subscribers (a batch dropped for 3 counts 3).
	SubscriberDropped uint64
	// SubscriberQueuedBytes: bytes the subscribers' queues hold now, all together (a batch
	// queued for n subscribers counts n times; each queue's is bounded by
	// SubscriberQueueBytes). SubscriberHeldBytes: the memory they take, equal batches
	// being held once.
	SubscriberQueuedBytes, SubscriberHeldBytes int64
	// SendFailed: batches the PUB socket refused (not sent to anyone).
	SendFailed uint64
	// Lost: batches the source dropped before the publisher read them (its channel was
	// full) and its ring no longer held.
	Lost uint64
	// Accepted: connections the sockets took (ZMQ_EVENT_ACCEPTED and _CONNECTED).
	Accepted uint64
	// Disconnected: connections the sockets closed (ZMQ_EVENT_DISCONNECTED): a peer that
	// left, or one that broke the protocol, a frame over MaxMessageBytes included (libzmq
	// reports both alike).
	Disconnected uint64
	// Cut: connections of a bound tcp:// or ipc:// socket closed by the publisher before
	// libzmq read what broke the rules: a frame declaring more than MaxMessageBytes, a
	// message of more than 4 frames or MaxMessageBytes in all, a stream that is not ZMTP 3;
	// or, closed at once, a connection beyond 256 at once on one socket.
	Cut uint64
	// HandshakeFailed: connections dropped during the ZMTP handshake
	// (ZMQ_EVENT_HANDSHAKE_FAILED_*: a bad greeting or command, one over MaxMessageBytes).
	HandshakeFailed uint64
	// ReplayRequests: well-formed replay requests; ReplayBadRequests: other messages (not
	// [empty, 8-byte seq]), ignored.
	ReplayRequests, ReplayBadRequests uint64
	// ReplaySent: batches sent in replies; ReplayCut: replies cut short because the client
	// left or read nothing for ReplayTimeout.
	ReplaySent, ReplayCut uint64
	// HistoryBatches and HistoryBytes: what the replay history holds now (encoded bytes).
	HistoryBatches int
	HistoryBytes   int64
}

// Source is what a Publisher reads: a hicache.Cache that publishes events.
type Source interface {
	Subscribe(fromSeq uint64) (<-chan hicache.EventBatch, func(), error)
	EventsSince(seq uint64) ([]hicache.EventBatch, error)
	NextEventSeq() (uint64, error)
}

// Publisher sends a cache's event batches on ZMQ until Close.
type Publisher struct {
	src     Source
	opts    Options
	ctx     *zmq.Context
	pub     *zmq.Socket // owned by run, then by Close
	replay  *zmq.Socket // owned by serveReplay; nil without ReplayEndpoint
	mons    []*zmq.Socket
	cancel  func()
	ran     chan struct{} // closed when run returns
	stop    chan struct{} // closed by Close: the replay and monitor loops end
	wg      sync.WaitGroup
	pubEp   string
	replyEp string
	hist    *history
	guards  []*guard
	privDir string // the private ipc endpoints' directory
	cut     atomic.Uint64
	subs    subscriberTotals
	pubG    *guard // the PUB socket's guard; nil when it is not a bound tcp:// or ipc://

	published, sendFailed, lost                      atomic.Uint64
	accepted, disconnected, handshakeFailed          atomic.Uint64
	replayRequests, replayBad, replaySent, replayCut atomic.Uint64
	closeOnce                                        sync.Once
}

var monitorSeq atomic.Uint64

// Start loads libzmq (a *zmq.LoadError names the library and the Debian package when it is
// missing), opens the sockets and publishes src's batches, from its first one (or, when
// that has left its ring, from its next one), in a background goroutine until Close.
func Start(src Source, o Options) (*Publisher, error) {
	if o.Endpoint == "" {
		return nil, errors.New("kvevents: no endpoint")
	}
	if err := CheckEndpoint(o.Endpoint, Bindable(o.Endpoint)); err != nil {
		return nil, err
	}
	if o.ReplayEndpoint != "" {
		if err := CheckEndpoint(o.ReplayEndpoint, true); err != nil {
			return nil, fmt.Errorf("%w (the replay endpoint)", err)
		}
	}
	if o.SubscriberQueueBytes > 0 && o.SubscriberQueueBytes < MinSubscriberQueue {
		return nil, fmt.Errorf("kvevents: SubscriberQueueBytes %d is under %d", o.SubscriberQueueBytes, MinSubscriberQueue)
	}
	o.defaults()
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	p := &Publisher{src: src, opts: o, ctx: ctx, ran: make(chan struct{}), stop: make(chan struct{}),
		hist: &history{bound: o.HistoryBytes}}
	fail := func(err error) (*Publisher, error) {
		p.closeSockets()
		return nil, err
	}
	if p.pub, err = p.socket(zmq.PUB, o.Endpoint, map[int]int64{zmq.SndHWM: int64(o.SendHWM), zmq.RcvHWM: peerRcvHWM}); err != nil {
		return fail(err)
	}
	if Bindable(o.Endpoint) {
		p.pubEp, err = p.bind(p.pub, o.Endpoint, "pub")
	} else {
		// A subscriber that binds (a collector this rank trusts): connected to directly.
		if err = p.pub.Connect(o.Endpoint); err == nil {
			p.pubEp = o.Endpoint
		}
	}
	if err != nil {
		return fail(fmt.Errorf("kvevents: endpoint %q: %w", o.Endpoint, err))
	}
	if o.ReplayEndpoint != "" {
		if p.replay, err = p.socket(zmq.ROUTER, o.ReplayEndpoint, map[int]int64{
			zmq.SndHWM: int64(o.ReplayHWM), zmq.RcvHWM: peerRcvHWM, zmq.RouterMandatory: 1}); err != nil {
			return fail(err)
		}
		if p.replyEp, err = p.bind(p.replay, o.ReplayEndpoint, "replay"); err != nil {
			return fail(fmt.Errorf("kvevents: replay endpoint %q: %w", o.ReplayEndpoint, err))
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
	p.wg.Add(1)
	go p.watch()
	if p.replay != nil {
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// peerRcvHWM is how many complete messages libzmq queues from one peer (subscriptions,
// replay requests) before it stops reading that peer.
const peerRcvHWM = 16

// bind binds s to ep and returns the endpoint peers use. An inproc:// endpoint is bound
// as is; a tcp:// or ipc:// one is a guard's (see guard), s being bound to a private ipc://
// endpoint in a directory only this process's user can enter.
func (p *Publisher) bind(s *zmq.Socket, ep, name string) (string, error) {
	if strings.HasPrefix(ep, "inproc://") {
		if err := s.Bind(ep); err != nil {
			return "", err
		}
		return ep, nil
	}
	if p.privDir == "" {
		d, err := os.MkdirTemp("", "cpcache-kv-")
		if err != nil {
			return "", err
		}
		p.privDir = d
	}
	private := filepath.Join(p.privDir, name)
	if len(private) > maxIPCPath {
		return "", fmt.Errorf("private socket path %q is over %d bytes (set TMPDIR to a shorter directory)", private, maxIPCPath)
	}
	if err := s.Bind("ipc://" + private); err != nil {
		return "", err
	}
	ln, err := listenPublic(ep)
	if err != nil {
		return "", err
	}
	var out *outConfig
	if s == p.pub {
		out = &outConfig{maxBytes: p.opts.SubscriberQueueBytes, maxMsgs: p.opts.SendHWM, totals: &p.subs, pool: newMsgPool(&p.subs.held)}
	}
	var stall time.Duration
	if s == p.replay {
		stall = p.opts.ReplayTimeout
	}
	g := startGuard(ln, private, p.opts.MaxMessageBytes, &p.cut, out, stall)
	if out != nil {
		p.pubG = g
	}
	p.guards = append(p.guards, g)
	return publicEndpoint(ep, ln), nil
}

// socket makes a socket of type t for ep with ZMQ_MAXMSGSIZE, the options given, and a
// monitor counting its connections.
func (p *Publisher) socket(t zmq.Type, ep string, opts map[int]int64) (*zmq.Socket, error) {
	s, err := p.ctx.Socket(t)
	if err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	opts[zmq.MaxMsgSize] = p.opts.MaxMessageBytes
	if strings.Contains(ep, "[") || strings.Contains(ep, "::") {
		opts[zmq.IPv6] = 1
	}
	for k, v := range opts {
		if err := s.SetInt(k, v); err != nil {
			s.Close()
			return nil, fmt.Errorf("kvevents: %w", err)
		}
	}
	name := fmt.Sprintf("inproc://cpcache-kvevents-monitor-%d", monitorSeq.Add(1))
	events := zmq.EventAccepted | zmq.EventConnected | zmq.EventDisconnected | zmq.EventHandshakeFailedAnyMask
	if err := s.Monitor(name, events); err != nil {
		s.Close()
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	m, err := p.ctx.Socket(zmq.PAIR)
	if err == nil {
		if err = m.Connect(name); err != nil {
			m.Close()
		}
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	p.mons = append(p.mons, m)
	return s, nil
}

// Endpoints are the addresses the sockets use (a bound port 0 resolved); replay "" without
// one.
func (p *Publisher) Endpoints() (pub, replay string) { return p.pubEp, p.replyEp }

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	n, b := p.hist.size()
	return Stats{
		Published: p.published.Load(), SendFailed: p.sendFailed.Load(), Lost: p.lost.Load(),
		Cut: p.cut.Load(), Accepted: p.accepted.Load(), Disconnected: p.disconnected.Load(), HandshakeFailed: p.handshakeFailed.Load(),
		ReplayRequests: p.replayRequests.Load(), ReplayBadRequests: p.replayBad.Load(),
		ReplaySent: p.replaySent.Load(), ReplayCut: p.replayCut.Load(),
		HistoryBatches: n, HistoryBytes: b,
		SubscriberDropped: p.subs.dropped.Load(), SubscriberQueuedBytes: p.subs.queued.Load(),
		SubscriberHeldBytes: p.subs.held.Load(),
	}
}

// Subscribers describes each subscriber connected now to a bound tcp:// or ipc:// PUB
// socket (nil for another endpoint), in no order.
func (p *Publisher) Subscribers() []SubscriberStats {
	if p.pubG == nil {
		return nil
	}
	return p.pubG.subscribers()
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
			have := next
			for _, m := range missed {
				if m.Seq >= have && m.Seq < b.Seq {
					p.lost.Add(m.Seq - have)
					p.send(m)
					have = m.Seq + 1
				}
			}
			p.lost.Add(b.Seq - have)
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
	// libzmq learns that a subscriber's connection took batches from commands its I/O
	// thread leaves for the socket, which Send processes at most once a millisecond: a
	// subscriber that took every batch would still look SendHWM batches behind after
	// SendHWM batches in that millisecond, and lose the next. Reading Events processes
	// them, so a subscriber's queue holds what it has not taken, as SendHWM says.
	if _, err := p.pub.GetInt(zmq.Events); err != nil {
		p.logf(fmt.Errorf("kvevents: before batch %d: %w", b.Seq, err))
	}
	// A PUB socket never blocks: libzmq queues the batch for each subscriber with room.
	if err := p.pub.Send(zmq.DontWait, []byte(p.opts.Topic), seq[:], payload); err != nil {
		p.sendFailed.Add(1)
		p.logf(fmt.Errorf("kvevents: sending batch %d: %w", b.Seq, err))
	} else {
		p.published.Add(1)
	}
	p.hist.add(b.Seq, payload)
}

// watch counts the sockets' connection events until Close.
func (p *Publisher) watch() {
	defer p.wg.Done()
	items := make([]zmq.PollItem, len(p.mons))
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		for i, m := range p.mons {
			items[i] = zmq.PollItem{Socket: m, Events: zmq.PollIn}
		}
		if _, err := zmq.Poll(items, 100); err != nil {
			if err != zmq.EINTR {
				p.logf(fmt.Errorf("kvevents: monitor: %w", err))
				return
			}
			continue
		}
		for i, it := range items {
			if it.Ready&zmq.PollIn == 0 {
				continue
			}
			frames, _, err := p.mons[i].Recv(zmq.DontWait, 2)
			if err != nil {
				continue
			}
			ev, _, _, ok := zmq.MonitorEvent(frames)
			switch {
			case !ok:
			case ev == zmq.EventAccepted || ev == zmq.EventConnected:
				p.accepted.Add(1)
			case ev == zmq.EventDisconnected:
				p.disconnected.Add(1)
			case ev&zmq.EventHandshakeFailedAnyMask != 0:
				p.handshakeFailed.Add(1)
			}
		}
	}
}

func (p *Publisher) closeSockets() {
	for _, g := range p.guards {
		g.close()
	}
	for _, s := range append([]*zmq.Socket{p.pub, p.replay}, p.mons...) {
		if s != nil {
			s.Close()
		}
	}
	if p.ctx != nil {
		if err := p.ctx.Close(); err != nil {
			p.logf(err)
		}
	}
	if p.privDir != "" {
		os.RemoveAll(p.privDir)
	}
}

// Close stops publishing: the batches already made are sent, the sockets stay open for
// Options.Linger, then close. Call it after the cache's last Step. Idempotent.
func (p *Publisher) Close() error {
	if p == nil {
		return nil
	}
	p.closeOnce.Do(func() {
		p.cancel() // closes the subscription's channel: run sends what it holds and returns
		<-p.ran
		if p.opts.Linger > 0 {
			time.Sleep(p.opts.Linger)
		}
		close(p.stop)
		p.wg.Wait()
		p.closeSockets()
	})
	return nil
}
