// Package sched is the serving scheduler of a simulated run: it admits a replica's requests
// by arrival, token budget and L1 room, prefills them through a cache (match, prefetch from
// storage, load-back, verify, insert, compute), decodes them and inserts their answers, on
// a virtual clock (sim/vtime). It drives any Cache: a rank's *hicache.Cache, or NullCache,
// which holds nothing, for the same workload with the cache off. Faults are a hook
// (Faults); the miss attribution and live counters are observers (Observer) told at a few
// named points.
package sched
