// Package engine is the interface between the hicache driver and the copy engines that move
// pages between a rank's L1 (its KV pool) and the L2 slabs: Engine, its Ticket, and the
// memory views the engines and the storage driver share (L1Memory, HostSlabs).
//
// Contract: the driver submits the core's transfers in the order the core made them and
// polls their tickets at each step; completion is a local event that the next consensus step
// turns into a commit or an abort on every rank. Submit never waits for copies; Cancel
// finishes not-yet-started transfers with ErrCanceled; Close (nil-safe, idempotent) cancels,
// waits and releases. Implementations: hicache/hostengine (host memory, goroutines) and
// hicache/cudaengine (CUDA streams and events).
package engine
