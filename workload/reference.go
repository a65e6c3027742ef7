package workload

import (
	"container/list"

	"github.com/cpcache/cpcache/hicache/core"
)

// Reference hit rates computed from a workload alone, without a cache: the bounds and
// baselines a measured hit rate is read against.
//
// A request's cacheable prefix is made of whole units (pages or blocks) of its prompt; a
// unit is identified by its chained prefix hash under the request's isolation key
// (core.KeyPrefixHashes, the cache's own page identity), so two units are equal only when
// their whole prefixes and keys are. Requests are taken in workload order; a request "leaves" its prompt and its answer (Answer) behind, as a
// server that inserts a finished request with its answer does.

// withAnswer is r's prompt followed by its answer.
func withAnswer(r Request) []int32 {
	return append(r.Tokens[:len(r.Tokens):len(r.Tokens)], Answer(r)...)
}

// ReuseBound is the number of prompt tokens an unlimited cache with pages of pageSize
// tokens serves when requests run one at a time in order: the leading whole pages of each
// prompt that some earlier request's prompt or answer already held. No cache of that page
// size can hit more tokens in that order; concurrency can only turn some of these hits into
// misses (a prefix still being computed). A page size that is not positive serves nothing.
func ReuseBound(reqs []Request, pageSize int) int64 {
	if pageSize <= 0 {
		return 0 // core.PrefixHashes would divide by it
	}
	seen := map[core.PageID]struct{}{}
	var hits int64
	for _, r := range reqs {
		for _, h := range core.KeyPrefixHashes(r.Key, r.Tokens, pageSize) {
			if _, ok := seen[h]; !ok {
				break
			}
			hits += int64(pageSize)
		}
		for _, h := range core.KeyPrefixHashes(r.Key, withAnswer(r), pageSize) {
			seen[h] = struct{}{}
		}
	}
	return hits
}

// LRUBlockHits is the number of prompt tokens served, in order, by an LRU cache of
// capacityBlocks blocks of blockTokens tokens (the granularity of a Mooncake trace's hash
// ids: BlockTokens, or BlockTokens/N for a trace read at TraceOptions.Scale N): a prompt
// hits its leading cached blocks, then every block of the prompt and its answer becomes the
// most recently used, the least recently used blocks leaving when the capacity is exceeded.
// It is the textbook baseline a paged, tiered cache of the same capacity is compared with.
// A block size or capacity that is not positive serves nothing.
func LRUBlockHits(reqs []Request, blockTokens, capacityBlocks int) int64 {
	if blockTokens <= 0 || capacityBlocks <= 0 {
		return 0 // core.KeyPrefixHashes would divide by the block size
	}
	order := list.New() // front: most recently used; values are block hashes
	at := map[core.PageID]*list.Element{}
	var hits int64
	for _, r := range reqs {
		for _, h := range core.KeyPrefixHashes(r.Key, r.Tokens, blockTokens) {
			if _, ok := at[h]; !ok {
				break
			}
			hits += int64(blockTokens)
		}
		for _, h := range core.KeyPrefixHashes(r.Key, withAnswer(r), blockTokens) {
			if e, ok := at[h]; ok {
				order.MoveToFront(e)
				continue
			}
			at[h] = order.PushFront(h)
			if order.Len() > capacityBlocks {
				last := order.Back()
				delete(at, last.Value.(core.PageID))
				order.Remove(last)
			}
		}
	}
	return hits
}
