// Package storagetest is the conformance suite every storage backend must pass: the
// contract of storage.Storage (hits, misses, leading counts, overwrite, delete, namespaces,
// Clear, verification of stored values, argument checks, Close, concurrent use), run by
// each backend's tests against a real store.
//
// Contract: Conformance fails the test if the backend breaks any rule of the storage.Storage
// contract; every check uses its own fresh namespace, so checks may share a store.
//
// Ownership: the Backend opens one storage.Storage per check; the suite clears and closes
// it in the test's cleanup.
//
// Usage: a backend's test calls storagetest.Conformance(t, backend) with a Backend whose Open
// returns a handle on a real store (a temporary directory, a Redis server started for the
// test).
package storagetest
