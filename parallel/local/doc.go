// Package local is an in-process parallel.Group: N members in one process, one goroutine each.
//
// It behaves like a real backend so that everything above parallel can be tested with many ranks
// and no I/O: a member that never arrives makes the others fail at the deadline with
// parallel.ErrTimeout; a member that Closes makes the others fail with parallel.ErrPeerLost; members
// that call different collectives (or the same one with a different op, length or root) at
// the same position in their operation sequence all fail with parallel.ErrMismatch instead of
// exchanging mismatched data. After any such error a member refuses further use with it.
//
// Ownership: New and World return the members; the caller closes each (Close is nil-safe
// and idempotent). A Member's collectives and Close are called from one goroutine at a time.
//
// Usage:
//
//	members := local.World(8, local.Options{Timeout: time.Second})
//	for _, m := range members { go run(m) } // each goroutine uses its own member
package local
