// Package shmseg creates and maps the shared-memory segment files that ranks of one machine
// share (parallel/shm's group segments, slab's host slabs).
//
// Contract: Create makes a new file exclusively (O_EXCL, mode 0600 whatever the umask), sizes
// it, optionally reserving the memory, and maps it shared read-write; on failure nothing is
// left at the path. Open maps an existing file without following a symlink, after the
// caller's check of its stat. Errors name the path and say what failed, without a package
// prefix: callers add theirs ("shm: …", "slab: …").
//
// Ownership: the caller owns the returned mapping and the name (Unlink). Unmap with
// unix.Munmap: syscall.Munmap keeps its own table and refuses mappings made here (EINVAL).
//
// Usage loop: the creating rank calls Create and publishes the path; peers call Open; once
// every rank has mapped it, the creator calls Unlink; each rank unmaps on Close.
package shmseg
