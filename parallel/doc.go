// Package parallel is cpcache's distributed layer, in pure Go: the parallel Layout, the Group
// interface every backend implements, and the launcher environment.
//
// # Layout
//
// NewLayout turns (world, tp, dp, attention-CP, ep, DP-attention) into every group of the
// job as global rank lists, with SGLang's rules: attn_dp = dp under DP attention (else 1),
// attn_tp = tp/attn_dp/attn_cp, rank = dp_i*(attn_cp*attn_tp) + cp_i*attn_tp + tp_i. Two
// groups matter to the cache and both come from the one Layout, so they cannot disagree:
//
//   - the replica group (KindReplica, the attention-DP block): every rank that runs the same
//     scheduler and holds a replica of the cache metadata. Consensus runs here.
//   - the slab group (KindSlab, the attention-CP group): the ranks that share L2 slabs. It is
//     always inside the replica group. When the KV is replicated across attention-TP (MLA),
//     the attention-TP ranks of a CP index share one slab too: SharedSlabGroup is then the
//     slab group (the TP-0 rank of each CP index makes and writes its slab,
//     SharedSlabWriter), mapped by every rank of the DP block (SlabSharers, the replica group).
//
// # Groups
//
// Group is a process group with context-aware collectives (AllReduce of int64 vectors,
// Broadcast, AllGather, Barrier). Backends: parallel/local (in-process, for tests), gloo (CPU
// processes over TCP), parallel/shm (one node, shared memory), nccl (GPU). Every member calls the
// same collectives in the same order; a backend fails (never hangs) when the deadline passes,
// a peer is lost, or members disagree on the call, with an *OpError naming the group and the
// operation and wrapping ErrTimeout, ErrPeerLost or ErrMismatch. Count wraps a group to count
// its collectives, so tests can prove every rank made the same calls. The conformance suite
// in parallel/grouptest is shared by all backends.
//
// # Launch environment
//
// FromEnv reads rank and world size from torchrun-style, OpenMPI or Slurm variables, in that
// precedence, and rejects torchrun and OpenMPI variables that disagree; Slurm's describe the
// allocation and count only when no other launcher ran the process.
//
// # Ownership and usage
//
// A Group belongs to whoever created it (a backend constructor) and is closed by that owner.
// Count's wrapper shares the group it wraps: its Close closes that group. The usage loop
// of a rank:
//
//	env, err := parallel.FromEnv()                 // rank, world size
//	layout, err := parallel.NewLayout(cfg)         // every group of the job
//	world, err := gloo.NewWorld(ctx, opts)         // a backend's world group
//	// build the replica (consensus) and slab groups from layout, then per step:
//	err = group.AllReduce(ctx, parallel.Min, vals) // errors.Is(err, parallel.ErrPeerLost) etc.
package parallel
