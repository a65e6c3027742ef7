// Package gloo implements parallel.Group over Gloo (the library behind PyTorch's CPU process
// groups) with its TCP transport, through the C ABI in csrc/gloo_shim.{h,cc}; it needs
// Debian's libgloo-dev and libhiredis-dev (`make deps`) and no separate build step.
//
// # Rendezvous
//
// Ranks meet through a store given as a URL: file:///dir (a directory: one machine or a
// shared filesystem) or redis://[[user]:password@]host:port[/prefix] (a Redis server: several
// machines). The store is this package's own, in Go, and Gloo's rendezvous reads and writes
// its keys through the shim's callback store: every store call (connecting, AUTH, each
// read, write and wait, Gloo's included) is bounded by the rendezvous deadline
// (Options.Timeout or the context's), so a store that accepts connections and never
// answers fails NewWorld at its timeout with parallel.ErrTimeout.
//
// Or through a store the caller runs (Options.Rendezvous, a parallel.Store: an engine's
// torch.distributed.Store through libcpcache's callbacks): every key written there starts
// with "cpcache/", creates are counters (key#created) and the claim below is a chain of
// generations (userKV); each call on it runs in a goroutine of its own and is abandoned at
// the deadline, so a store that never answers fails NewWorld at its timeout all the same.
//
// A run is bound to its job. Every rank of a job has the same job id (Options.JobID, else
// parallel.JobIDFromEnv: CPCACHE_JOB_ID, which cpcache launch sets, or the launcher's own:
// torchrun, OpenMPI, Slurm), and a job's keys live in a space of the store of its own
// ("<prefix>/job-<hash>/"), so two jobs on one store at once never see each other's keys.
// Within a space, rank 0 claims the store for a fresh run id until its deadline; a second
// job in the same space (the same job id, or none) whose rank 0 finds a live claim fails at
// once with ErrStoreInUse, and a process that joins a run as a rank another process already
// joined as fails the same way; when both have the same non-empty job id, the error says two
// processes claim that rank of the job (ErrDuplicateRank; it matches ErrStoreInUse too).
// Every other rank acknowledges the claimed run with its own nonce, and rank 0 confirms the list of nonces; every key of the run lives under
// "<space>/<run id>/", so keys left by an earlier run are never read. Each group has its own
// sub-prefix. Rank 0 releases the claim once the world is connected.
//
// The store does not grow: a file store writes each key under a temporary name and renames
// it into place (readers never see a partial or missing value), every process removes the
// keys it wrote when its world is closed, and rank 0 removes, when it claims the store, what
// runs that were killed left (keys nobody wrote for an hour, or twice the timeout if longer;
// temporary files older than a minute). Redis keys also expire (twice the timeout plus a
// minute). A file store opens every path through an os.Root on its directory, so a symbolic
// link in it never leads outside.
//
// Cancelling NewWorld's context (a SIGINT or SIGTERM of the rank) ends it at once with an
// error wrapping context.Canceled. CheckStore checks a store URL without changing anything
// (parsed; a file store's directory usable; a Redis store answers PING with PONG, after AUTH
// when the URL has a password, within the context's deadline), so a launcher can refuse a
// bad one before starting ranks: a Redis store that wants a password the URL does not give,
// or refuses the one it gives, is parallel.ErrBadArgument. Store errors never quote a
// password.
//
// Each process listens on one address: Options.Iface / CPCACHE_GLOO_IFACE /
// GLOO_SOCKET_IFNAME (an interface), else Options.Hostname / CPCACHE_GLOO_HOSTNAME, else
// 127.0.0.1 when every rank is on this machine, else what the host name resolves to.
//
// # Groups
//
// NewWorld returns the world group; NewGroup(world, ranks) a group over a subset and
// NewLayoutGroups(world, layout) this rank's group of every kind of a parallel.Layout. Both are
// collective over the world (every rank calls them in the same order, with the same
// arguments, which is checked: a mismatch fails with parallel.ErrMismatch). Non-members of a
// NewGroup get nil. The world group owns the store and the TCP device; sub-groups stay
// usable after it is closed, but no new group can be made from a closed world.
//
// # Failures
//
// Each collective has a deadline: the context's, or the group's timeout when that is
// earlier (Options.Timeout, default parallel.DefaultTimeout). A peer that exits or closes its
// group makes the survivors' current or next collective fail promptly with an error wrapping
// parallel.ErrPeerLost: the member that sees the broken connection closes all of its own, so the
// failure reaches every member. A stalled peer makes the others fail at their deadline with
// parallel.ErrTimeout (also wrapping context.DeadlineExceeded when the context's deadline was
// the one that passed). Any such error is sticky: the group then refuses every call with the
// same error (wrapped in a new parallel.OpError). Cancelling a context without a deadline is only
// observed before an operation starts.
//
// Gloo writes to its sockets without MSG_NOSIGNAL, so NewWorld routes SIGPIPE to a channel
// (os/signal.Notify) for the rest of the process: a peer's exit then fails the write
// instead of killing this rank. Writes to a closed stdout or stderr also return EPIPE then.
//
// # Algorithms
//
// Groups of up to 32 members (CPCACHE_GLOO_DIRECT_MAX changes the limit; 0 disables it)
// exchange small messages directly over Gloo's transport: every member sends one 512-byte
// frame to every other — one network hop instead of the 2(n-1) of Gloo's ring — whose header
// names the collective and its arguments, so members that call different collectives (or
// AllReduce with a different op or length, Broadcast with a different root) fail with
// parallel.ErrMismatch instead of mixing data. Payloads beyond a frame take a second phase
// (direct for Broadcast, Gloo's ring allreduce and allgatherv otherwise); larger groups use
// Gloo's algorithms throughout and do not detect mismatches.
//
// # Usage
//
// One goroutine issues a group's collectives; a mutex serialises concurrent callers, but
// their order across ranks is then undefined.
//
//	world, err := gloo.NewWorld(ctx, gloo.Options{}) // RANK/WORLD_SIZE/CPCACHE_STORE from the launcher
//	defer world.Close()
//	groups, err := gloo.NewLayoutGroups(world, layout)
//	defer groups.Close()
//	cp := groups.Group(parallel.KindAttnCP)
//	for step := range steps { err = cp.AllReduce(ctx, parallel.Min, vec) }
package gloo
