// Package shm is a parallel.Group backend for groups whose members all run on one host: its
// collectives go through a shared-memory segment instead of sockets, so a consensus step
// (an AllReduce of a few int64) costs microseconds rather than the tens to hundreds of
// microseconds of a TCP loopback round trip.
//
// # Contract
//
// A Group is created collectively with New (or Consensus) on every member of a bootstrap
// parallel.Group (a Gloo group, or a parallel/local group in tests). Creation exchanges each member's
// host identity (hostname, boot id, network and pid namespaces, and the device and inode of
// the shared-memory directory) and pid over the bootstrap group; members that are not all on
// one host (or one that cannot tell its identity) make New fail on every member with an
// error wrapping ErrNotLocal, and Consensus use the bootstrap group. Rank 0 then
// creates an anonymous segment (memfd, see internal/shmseg), sizes and initialises it and
// broadcasts its handle, an abstract Unix socket that hands the segment's descriptor to
// members of the same user; every other member receives and maps it; the members agree that
// all mapped it (an AllGather of statuses over the bootstrap group), and rank 0 stops
// offering it, whatever the outcome. The segment has no name in /dev/shm at any moment and
// the kernel frees it with the last member's process, so no crash, kill -9 included, can
// leave it behind.
//
// The Group has the bootstrap group's rank, size, global ranks and name. It implements:
//   - AllReduce of int64 vectors up to SlotBytes/8 elements (512 by default) in shared
//     memory; longer vectors go through the bootstrap group;
//   - Broadcast and AllGather of payloads up to SlotBytes (4 KiB by default) per member in
//     shared memory; when the root's payload (Broadcast) or any member's (AllGather) is
//     longer, every member sees that in the shared-memory round and all of them use the
//     bootstrap group for that operation, so the choice is the same on every member;
//   - Barrier.
//
// Every operation, fallback or not, is one shared-memory round: each member writes a
// descriptor (operation, reduce op or root, length) and its data into its slot of the
// round's buffer, publishes its arrival, and waits until all members have arrived. Rounds
// alternate between two buffers, and a member can only start round g+2 after every member
// has arrived at g+1 and so finished reading round g: consecutive operations never mix.
// Members that called different collectives, or AllReduce with a different op or length, or
// Broadcast with a different root, all fail with parallel.ErrMismatch.
//
// Waiting spins briefly (a few hundred checks when the group has no more members than
// CPUs, a few dozen otherwise), then yields the CPU a few times so that members that have
// not arrived can run, then sleeps on a futex in the segment (a shared futex, since it
// crosses processes), woken by the last member to arrive: no waiter holds a CPU for long. While asleep a waiter wakes every Options.PollInterval to check
// its deadline and context, whether a missing member closed the group, and whether a missing
// member's process exited (through a pidfd, or kill(pid, 0) where pidfds are unavailable).
//
// # Failure
//
// Every collective fails within its deadline (the context's, or Options.Timeout when
// earlier) with a *parallel.OpError wrapping parallel.ErrTimeout or parallel.ErrPeerLost; the first
// member that fails publishes the reason in the segment and wakes the others, so every
// survivor fails promptly with it instead of waiting for its own deadline. After any error
// other than parallel.ErrBadArgument the Group is unusable: every later call returns the same
// error. A failed bootstrap fallback is fatal in the same way.
//
// # Ownership and usage
//
// The caller owns the bootstrap group: it must stay open while the shm Group is used (it
// carries large payloads) and is closed by the caller after the shm Group. Close unmaps the
// segment and marks this member gone, so peers waiting for it fail with parallel.ErrPeerLost;
// it is nil-safe, idempotent, and may be called from another goroutine while a collective
// waits in shared memory (that collective then fails with parallel.ErrClosed; one running
// through the bootstrap group finishes or fails first). Like every parallel.Group, a Group runs
// one collective at a time; concurrent calls are serialised.
//
// Typical use, on every member:
//
//	boot, _ := gloo.NewGroup(...)              // or any parallel.Group
//	g, backend, err := shm.Consensus(ctx, boot, shm.Options{})
//	if err != nil { ... }
//	defer boot.Close()
//	defer g.Close()
//	for step := range steps {
//	    vec := consensusVector(step)
//	    if err := g.AllReduce(ctx, parallel.Min, vec); err != nil { ... } // fatal for the group
//	}
//
// Consensus picks shared memory when all members are on one host and the bootstrap group
// otherwise; the environment variable CPCACHE_CONSENSUS_BACKEND (or Options.Backend)
// set to "gloo" forces the bootstrap group (for comparison), "shm" requires shared memory
// (an error when members are not local), and "auto" (the default) chooses. All members must
// use the same setting; a disagreement fails on every member.
package shm
