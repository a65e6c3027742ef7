package gloo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cpcache/cpcache/internal/redact"
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
	// Store is the rendezvous store URL; "" reads CPCACHE_STORE. A world of one needs none:
	// without one it meets in a private directory removed with the group.
	Store string
	// Rendezvous is a store the caller runs (an engine's torch.distributed.Store), instead of
	// a URL: every key this package writes in it starts with "cpcache/", so the caller's own
	// keys are never touched, and every call on it is bounded by the rendezvous deadline (a
	// call that does not return by then is abandoned). Not with Store.
	Rendezvous parallel.Store
	// StoreArg names the store argument of the API in use in the error of a world given
	// none ("": the cpcache commands' --store or CPCACHE_STORE).
	StoreArg string
	// LocalSize is the number of ranks on this machine, with Size (0: unknown). A world whose
	// ranks are all on one machine (LocalSize == Size) listens on 127.0.0.1.
	LocalSize int
	// Rank and Size place this process; Size 0 reads them with parallel.FromEnv (torchrun,
	// OpenMPI or Slurm variables).
	Rank, Size int
	// Timeout bounds rendezvous and every collective whose context has no earlier deadline
	// (default parallel.DefaultTimeout).
	Timeout time.Duration
	// Iface is the network interface to listen on ("" reads CPCACHE_GLOO_IFACE, then
	// GLOO_SOCKET_IFNAME). It takes precedence over Hostname.
	Iface string
	// JobID tells this job's ranks from another job's on the same store: every rank of a job
	// must have the same one, and two jobs using one store at once different ones ("" reads
	// parallel.JobIDFromEnv: CPCACHE_JOB_ID, which cpcache launch sets, else the launcher's
	// job id). Ranks without one share the store's "shared" space, where a second job is
	// refused with ErrStoreInUse while the first is joining.
	JobID string
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
	// ownDir is the private store directory of a world of one given no store ("" if none),
	// removed after the store closes.
	ownDir string
}

func (s *shared) close() {
	s.once.Do(func() {
		s.store.close()
		s.dev.close()
		if s.ownDir != "" {
			os.RemoveAll(s.ownDir)
		}
	})
}

// NewWorld joins the world group: every rank calls it with the same store. It agrees on a
// fresh run id through the store (so keys left by an earlier run are never read), then
// connects every pair of ranks.
func NewWorld(ctx context.Context, opts Options) (*Group, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = parallel.DefaultTimeout
	}
	if opts.Store != "" && opts.Rendezvous != nil {
		return nil, badStore("gloo: both a store URL (Store %q) and a store object (Rendezvous): give one", redact.URL(opts.Store))
	}
	local := opts.Size > 0 && opts.LocalSize == opts.Size
	if opts.Size == 0 {
		env, err := parallel.FromEnv()
		if err != nil {
			return nil, fmt.Errorf("gloo: %w", err)
		}
		opts.Rank, opts.Size = env.Rank, env.WorldSize
		local = env.LocalWorldSize == env.WorldSize
		if opts.Store == "" && opts.Rendezvous == nil {
			opts.Store = env.Store
		}
	}
	if opts.Size < 1 || opts.Rank < 0 || opts.Rank >= opts.Size {
		return nil, fmt.Errorf("gloo: %w: rank %d of world size %d", parallel.ErrBadArgument, opts.Rank, opts.Size)
	}
	if opts.Store == "" && opts.Rendezvous == nil {
		opts.Store = os.Getenv(EnvStore)
	}
	ownDir := ""
	if opts.Store == "" && opts.Rendezvous == nil && opts.Size == 1 {
		dir, err := privateStoreDir()
		if err != nil {
			return nil, fmt.Errorf("gloo: %w: the store of a world of one: %v", parallel.ErrBadArgument, err)
		}
		ownDir, opts.Store = dir, "file://"+dir
	}
	if opts.Store == "" && opts.Rendezvous == nil {
		return nil, &NoStoreError{Rank: opts.Rank, Size: opts.Size, Arg: opts.StoreArg}
	}
	spec := userSpec()
	if opts.Rendezvous == nil {
		var err error
		if spec, err = parseStore(opts.Store); err != nil {
			return nil, err
		}
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
	if opts.JobID == "" {
		opts.JobID = parallel.JobIDFromEnv()
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
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel() // after success the store's own context lives on (see newStore)
	go func() {
		g, err := rendezvous(rctx, opts, spec, deadline)
		if g != nil {
			g.shared.ownDir = ownDir
		} else if ownDir != "" {
			os.RemoveAll(ownDir)
		}
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

// privateStoreDir makes the rendezvous directory of a world of one given no store. Its name
// and owner file are those of cpcache's job directories (cpcache-run-PID-N, .cpcache-owner
// holding the pid namespace), so that `cpcache cleanup` removes one a killed process left.
func privateStoreDir() (string, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("cpcache-run-%d-*", os.Getpid()))
	if err != nil {
		return "", err
	}
	ns, _ := os.Readlink("/proc/self/ns/pid")
	if err := os.WriteFile(filepath.Join(dir, ".cpcache-owner"), []byte(ns), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// rendezvous opens the store and the TCP device, agrees on the run id and connects the
// world group before deadline; cancelling ctx ends the store calls it waits in.
func rendezvous(ctx context.Context, opts Options, spec storeSpec, deadline time.Time) (*Group, error) {
	var b kv = &userKV{s: opts.Rendezvous}
	if opts.Rendezvous == nil {
		octx, ocancel := context.WithDeadline(ctx, deadline)
		var err error
		b, err = spec.openKV(octx, opts.Timeout)
		ocancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
	}
	// The store outlives this call (subgroups rendezvous through it): its context is not
	// ctx, which ends when NewWorld returns, but one that only cancel and close end.
	sctx, scancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, scancel)
	st, err := newStore(sctx, spec, b)
	if err != nil {
		scancel()
		b.close()
		return nil, err
	}
	defer stop()
	dev, err := newDevice(opts.Hostname, opts.Iface)
	if err != nil {
		st.close()
		return nil, fmt.Errorf("gloo: tcp device (hostname %q, iface %q): %w", opts.Hostname, opts.Iface, err)
	}
	sh := &shared{store: st, dev: dev}
	space := jobSpace(spec.prefix, opts.JobID)
	st.mu.Lock()
	st.deadline = deadline
	st.mu.Unlock()
	id, release, err := agreeRun(st, space, opts.JobID, opts.Rank, opts.Size, deadline, opts.Timeout)
	if err != nil {
		sh.close()
		return nil, err
	}
	if release != nil {
		defer release() // every rank has read the run's go key once the world is connected
	}
	sh.prefix = space + "/" + id
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
