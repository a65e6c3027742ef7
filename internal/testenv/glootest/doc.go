// Package glootest runs multiproc role functions on the Gloo world group of a rank process.
//
// Contract: Role wraps a function into a multiproc role: the rank process joins the Gloo
// world described by its environment (RANK, WORLD_SIZE and the store in CPCACHE_STORE, see
// gloo.NewWorld), the function runs on it, and the world is closed when the function
// returns, whatever it returns. A failure to join is the role's error.
//
// Ownership: the world group belongs to Role; the function must not close it or keep it.
//
// Usage loop: in a test package's init, multiproc.Register("name", glootest.Role(timeout, fn));
// the test sets CPCACHE_STORE in the multiproc.Spec's Env and calls multiproc.Run.
package glootest
