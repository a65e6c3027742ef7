// Package metrics exports one rank's hicache.Cache to Prometheus: NewCollector(cache,
// RankLabels(layout, rank), storage) is a prometheus.Collector of the rank's Stats
// (cpcache_ names, labels rank, replica and slab_group, a histogram of the consensus latency
// fed from Stats.ConsensusLatency) that the engine registers; each scrape takes one Stats
// snapshot. The caller owns the registry; the collector holds the Cache.
//
// It is a package of its own so that the cache (package hicache) and what links it, such as
// libcpcache, depend on the standard library and the project alone: only a program that
// serves metrics links the Prometheus client. It reads the cache only through its exported,
// value-returning methods (Cache.Stats, Cache.Geometry).
package metrics
