package gloo

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// Environment variables read by NewWorld when Options leave the value empty.
const (
	// EnvStore is the rendezvous store URL (file:///dir or redis://host:port[/prefix]).
	EnvStore = "CPCACHE_STORE"
	// EnvHostname is the address (or host name) this process listens on and advertises.
	EnvHostname = "CPCACHE_GLOO_HOSTNAME"
	// EnvIface is the network interface whose address this process listens on.
	EnvIface = "CPCACHE_GLOO_IFACE"
	// EnvIfaceTorch is PyTorch's name for EnvIface, honoured when EnvIface is unset.
	EnvIfaceTorch = "GLOO_SOCKET_IFNAME"
)

// Options configure NewWorld. Zero values mean "from the environment".
type Options struct {
	// Store is the rendezvous store URL; "" reads CPCACHE_STORE.
	Store string
	// Rank and Size place this process; Size 0 reads them with parallel.FromEnv (torchrun,
	// OpenMPI or Slurm variables).
	Rank, Size int
	// Timeout bounds rendezvous and every collective whose context has no earlier deadline
	// (default parallel.DefaultTimeout).
	Timeout time.Duration
	// Iface is the network interface to listen on ("" reads CPCACHE_GLOO_IFACE, then
	// GLOO_SOCKET_IFNAME). It takes precedence over Hostname.
	Iface string
	// Hostname is the address to listen on and advertise to peers ("" reads
	// CPCACHE_GLOO_HOSTNAME). With neither Iface nor Hostname, a job whose ranks are all on
	// this machine (LOCAL_WORLD_SIZE == WORLD_SIZE) uses 127.0.0.1, and any other job the
	// address this machine's host name resolves to.
	Hostname string
}

// shared is what every group created from one world uses: the store and the TCP device.
type shared struct {
	owner  *Group // the world group, which closes them
	prefix string // "<store prefix>/<run id>": every key of this run starts with it
	store  *store // serialised store access
	once   sync.Once
	dev    *cDevice // shared by every context (each holds its own reference)
}

func (s *shared) close() {
	s.once.Do(func() {
		s.store.close()
		s.dev.close()
	})
}

// NewWorld joins the world group: every rank calls it with the same store. It agrees on a
// fresh run id through the store (so keys left by an earlier run are never read), then
// connects every pair of ranks.
func NewWorld(ctx context.Context, opts Options) (*Group, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = parallel.DefaultTimeout
	}
	local := false
	if opts.Size == 0 {
		env, err := parallel.FromEnv()
		if err != nil {
			return nil, fmt.Errorf("gloo: %w", err)
		}
		opts.Rank, opts.Size = env.Rank, env.WorldSize
		local = env.LocalWorldSize == env.WorldSize
		if opts.Store == "" {
			opts.Store = env.Store
		}
	}
	if opts.Size < 1 || opts.Rank < 0 || opts.Rank >= opts.Size {
		return nil, fmt.Errorf("gloo: %w: rank %d of world size %d", parallel.ErrBadArgument, opts.Rank, opts.Size)
	}
	if opts.Store == "" {
		opts.Store = os.Getenv(EnvStore)
	}
	spec, err := parseStore(opts.Store)
	if err != nil {
		return nil, err
	}
	if opts.Iface == "" {
		opts.Iface = os.Getenv(EnvIface)
	}
	if opts.Iface == "" {
		opts.Iface = os.Getenv(EnvIfaceTorch)
	}
	if opts.Hostname == "" {
		opts.Hostname = os.Getenv(EnvHostname)
	}
	if opts.Iface == "" && opts.Hostname == "" && (local || opts.Size == 1) {
		opts.Hostname = "127.0.0.1"
	}
	deadline := parallel.Deadline(ctx, opts.Timeout)
	// The store and Gloo calls below block in C until their deadline; a cancelled context
	// (a signal) must end the rank at once, so they run in a goroutine that is abandoned on
	// cancellation and closes what it built when it returns.
	type result struct {
		g   *Group
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := rendezvous(opts, spec, deadline)
		done <- result{g, err}
	}()
	select {
	case r := <-done:
		return r.g, r.err
	case <-ctx.Done():
		if ctx.Err() != context.Canceled {
			r := <-done // the same deadline: the rendezvous reports its own timeout
			return r.g, r.err
		}
		go func() {
			if r := <-done; r.g != nil {
				r.g.Close()
			}
		}()
		return nil, fmt.Errorf("gloo: rendezvous of rank %d of %d interrupted: %w", opts.Rank, opts.Size, ctx.Err())
	}
}

// rendezvous opens the store and the TCP device, agrees on the run id and connects the
// world group before deadline.
func rendezvous(opts Options, spec storeSpec, deadline time.Time) (*Group, error) {
	cs, err := spec.open()
	if err != nil {
		return nil, err
	}
	st := &store{s: cs}
	dev, err := newDevice(opts.Hostname, opts.Iface)
	if err != nil {
		st.close()
		return nil, fmt.Errorf("gloo: tcp device (hostname %q, iface %q): %w", opts.Hostname, opts.Iface, err)
	}
	sh := &shared{store: st, dev: dev}
	id, err := agreeRun(st, spec.prefix, opts.Rank, opts.Size, deadline)
	if err != nil {
		sh.close()
		return nil, err
	}
	sh.prefix = spec.prefix + "/" + id
	ranks := make([]int, opts.Size)
	for i := range ranks {
		ranks[i] = i
	}
	c, err := st.newCtx(sh.prefix+"/world", opts.Rank, opts.Size, dev, time.Until(deadline))
	if err != nil {
		listen := dev.String()
		sh.close()
		return nil, fmt.Errorf("gloo: connect world (rank %d of %d, listening on %s): %w", opts.Rank, opts.Size, listen, classify(err, false))
	}
	g := &Group{
		name:    parallel.GroupName("world", ranks),
		rank:    opts.Rank,
		ranks:   ranks,
		timeout: opts.Timeout,
		shared:  sh,
		ctx:     c,
	}
	sh.owner = g
	return g, nil
}
