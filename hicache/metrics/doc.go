// Package metrics exports one rank's hicache.Cache to Prometheus: NewCollector(cache,
// RankLabels(layout, rank), storage) is a prometheus.Collector of the rank's Stats
// (cpcache_ names, labels rank, replica and slab_group, a histogram of the consensus latency
// fed from Stats.ConsensusLatency) that the engine registers; each scrape takes one Stats
// snapshot. The caller owns the registry; the collector holds the Cache. NewRankRegistry
// adds a KV event publisher's counters (PublisherCollectors); Text renders a registry in the
// text exposition format and Serve serves one on /metrics: the one implementation behind
// `cpcache run --metrics-addr`, job.Config.MetricsAddr and libcpcache's cpcache_metrics_text.
//
// It is a package of its own so that the cache (package hicache) depends on the standard
// library and the project alone: only what exports metrics (the runner, package job and so
// libcpcache) links the Prometheus client. It reads the cache only through its exported,
// value-returning methods (Cache.Stats, Cache.Geometry).
package metrics
