// Package shmseg creates and maps the shared-memory segments that ranks of one machine share
// (parallel/shm's group segments, slab's host slabs), so that a crash can leave nothing
// behind.
//
// Contract: a segment is anonymous memory (memfd_create): it has no name in /dev/shm or
// anywhere else, and the kernel frees it when the last process that maps or holds it exits,
// however it exits (kill -9 included). Create makes one, optionally reserving its memory,
// maps it shared read-write and offers its descriptor on an abstract Unix socket (Handle, a
// random name that also vanishes with its process) to peers of the same user only
// (SO_PEERCRED). Map, on a peer, connects to a handle, checks that the server runs as this
// user, receives the descriptor (SCM_RIGHTS), checks its size and maps it. Peers must share
// the host and the network namespace (abstract sockets live in it). Errors name the segment
// and say what failed, without a package prefix: callers add theirs ("shm: …", "slab: …").
//
// Ownership: the caller owns the mappings (unmap with unix.Munmap: syscall.Munmap keeps its
// own table and refuses mappings made here, EINVAL) and the Segment: Unshare stops offering
// it and closes the descriptor; it is nil-safe and idempotent.
//
// Usage loop: the creating rank calls Create and publishes Handle; peers call Map; once every
// rank has mapped it (or gave up), the creator calls Unshare; each rank unmaps on Close.
package shmseg
