// The one list of libcpcache's entry points that return a status: every function of
// include/cpcache.h except cpcache_version, cpcache_abi_version and cpcache_last_error (which
// csrc/cpcache_capi.c defines itself). Each line is CPCACHE_ENTRY(name, parameters,
// arguments): csrc/cpcache_capi.c defines the public cpcache_<name> from it — the fork check,
// then the Go function cpcapi_<name> (cmd/libcpcache, //export) — and compiles each
// definition against the header's prototype, so a parameter list that differs from the
// header's does not build. python/tests/test_abi.py checks that this list, plus the three,
// is the header's functions and what libcpcache.so exports. CPCACHE_ENTRY_PIDCHECK marks the
// rare calls whose fork check also compares getpid() with the pid recorded at load (see
// cpcache_capi.c); it is CPCACHE_ENTRY where the includer does not tell them apart.
// No include guard: included once per use, with CPCACHE_ENTRY defined.
#ifndef CPCACHE_ENTRY_PIDCHECK
#define CPCACHE_ENTRY_PIDCHECK CPCACHE_ENTRY
#define CPCACHE_ENTRY_PIDCHECK_DEFAULTED
#endif
CPCACHE_ENTRY(config_init, (cpcache_config *cfg), (cfg))
CPCACHE_ENTRY_PIDCHECK(open, (const cpcache_config *cfg, cpcache_t *out), (cfg, out))
CPCACHE_ENTRY_PIDCHECK(close, (cpcache_t c), (c))
CPCACHE_ENTRY_PIDCHECK(abort, (cpcache_t c), (c))
CPCACHE_ENTRY(get_info, (cpcache_t c, cpcache_info *info), (c, info))
CPCACHE_ENTRY(kv_bytes_per_token, (cpcache_t c, int64_t *out), (c, out))
CPCACHE_ENTRY(kv_page_bytes, (cpcache_t c, int64_t *out), (c, out))
CPCACHE_ENTRY(match,
              (cpcache_t c, const int32_t *tokens, size_t n, cpcache_match_result *out, int32_t *l1_slots,
               size_t slots_cap),
              (c, tokens, n, out, l1_slots, slots_cap))
CPCACHE_ENTRY(lock, (cpcache_t c, cpcache_node_t node), (c, node))
CPCACHE_ENTRY(unlock, (cpcache_t c, cpcache_node_t node), (c, node))
CPCACHE_ENTRY(load_back, (cpcache_t c, cpcache_node_t node, int64_t *pages), (c, node, pages))
CPCACHE_ENTRY(load_pending, (cpcache_t c, cpcache_node_t node, int32_t *pending), (c, node, pending))
CPCACHE_ENTRY(wait_l1, (cpcache_t c, cpcache_node_t node, int64_t timeout_ms), (c, node, timeout_ms))
CPCACHE_ENTRY(wait_l1_layer, (cpcache_t c, cpcache_node_t node, int32_t layer, int64_t timeout_ms),
              (c, node, layer, timeout_ms))
CPCACHE_ENTRY(wait_l1_layer_on, (cpcache_t c, cpcache_node_t node, int32_t layer, void *stream),
              (c, node, layer, stream))
CPCACHE_ENTRY(insert,
              (cpcache_t c, const int32_t *tokens, size_t n, cpcache_insert_result *out, cpcache_fill_page *fill,
               size_t fill_cap),
              (c, tokens, n, out, fill, fill_cap))
CPCACHE_ENTRY(match_key,
              (cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
               cpcache_match_result *out, int32_t *l1_slots, size_t slots_cap),
              (c, key, key_len, tokens, n, out, l1_slots, slots_cap))
CPCACHE_ENTRY(insert_key,
              (cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
               cpcache_insert_result *out, cpcache_fill_page *fill, size_t fill_cap),
              (c, key, key_len, tokens, n, out, fill, fill_cap))
CPCACHE_ENTRY(evict_l1, (cpcache_t c, int64_t pages, int64_t *freed), (c, pages, freed))
CPCACHE_ENTRY(evict_l1_ex, (cpcache_t c, int64_t pages, int64_t *freed, int64_t *pending),
              (c, pages, freed, pending))
CPCACHE_ENTRY(insert_slots,
              (cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
               const int32_t *slots, size_t n_slots, cpcache_insert_result *out, int32_t *freed,
               size_t freed_cap, size_t *n_freed),
              (c, key, key_len, tokens, n, slots, n_slots, out, freed, freed_cap, n_freed))
CPCACHE_ENTRY(load_back_plan,
              (cpcache_t c, cpcache_node_t node, int64_t *pages, size_t pages_cap, size_t *n_pages),
              (c, node, pages, pages_cap, n_pages))
CPCACHE_ENTRY(load_back_slots,
              (cpcache_t c, cpcache_node_t node, const int32_t *slots, size_t n_slots, int64_t *pages,
               int32_t *freed, size_t freed_cap, size_t *n_freed),
              (c, node, slots, n_slots, pages, freed, freed_cap, n_freed))
CPCACHE_ENTRY(evict_l1_slots,
              (cpcache_t c, int64_t pages, int64_t *freed_pages, int64_t *pending, int32_t *freed,
               size_t freed_cap, size_t *n_freed),
              (c, pages, freed_pages, pending, freed, freed_cap, n_freed))
CPCACHE_ENTRY(l1_used_by, (cpcache_t c, int32_t cp_rank, int64_t *used), (c, cp_rank, used))
CPCACHE_ENTRY(take_freed_l1, (cpcache_t c, int32_t *freed, size_t freed_cap, size_t *n_freed),
              (c, freed, freed_cap, n_freed))
CPCACHE_ENTRY(match_locs,
              (cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
               cpcache_match_result *out, int64_t *locs, size_t locs_cap, int32_t *l1_slots,
               size_t slots_cap),
              (c, key, key_len, tokens, n, out, locs, locs_cap, l1_slots, slots_cap))
CPCACHE_ENTRY(insert_locs,
              (cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
               const int64_t *locs, size_t n_locs, cpcache_insert_result *out, int64_t *freed,
               size_t freed_cap, size_t *n_freed, int64_t *kept, size_t kept_cap, size_t *n_kept),
              (c, key, key_len, tokens, n, locs, n_locs, out, freed, freed_cap, n_freed, kept, kept_cap, n_kept))
CPCACHE_ENTRY(load_back_locs,
              (cpcache_t c, cpcache_node_t node, const int64_t *locs, size_t n_locs, int64_t *pages,
               int64_t *freed, size_t freed_cap, size_t *n_freed),
              (c, node, locs, n_locs, pages, freed, freed_cap, n_freed))
CPCACHE_ENTRY(evict_locs,
              (cpcache_t c, int64_t tokens, int64_t *freed_tokens, int64_t *pending_tokens, int64_t *freed,
               size_t freed_cap, size_t *n_freed),
              (c, tokens, freed_tokens, pending_tokens, freed, freed_cap, n_freed))
CPCACHE_ENTRY(take_freed_locs, (cpcache_t c, int64_t *freed, size_t freed_cap, size_t *n_freed),
              (c, freed, freed_cap, n_freed))
CPCACHE_ENTRY(make_room,
              (cpcache_t c, int64_t start, int64_t end, const int64_t *reserved, int32_t *room,
               int64_t *freed, size_t freed_cap, size_t *n_freed),
              (c, start, end, reserved, room, freed, freed_cap, n_freed))
CPCACHE_ENTRY(evict_l2, (cpcache_t c, int64_t pages, int64_t *freed), (c, pages, freed))
CPCACHE_ENTRY(step, (cpcache_t c), (c))
CPCACHE_ENTRY(pending, (cpcache_t c, int64_t *pending), (c, pending))
CPCACHE_ENTRY(flush, (cpcache_t c), (c))
CPCACHE_ENTRY(prefetch, (cpcache_t c, const int32_t *tokens, size_t n, uint64_t *id), (c, tokens, n, id))
CPCACHE_ENTRY(prefetch_key,
              (cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n, uint64_t *id),
              (c, key, key_len, tokens, n, id))
CPCACHE_ENTRY(prefetch_pending, (cpcache_t c, uint64_t id, int32_t *pending), (c, id, pending))
CPCACHE_ENTRY(prefetch_revoke, (cpcache_t c, uint64_t id), (c, id))
CPCACHE_ENTRY(l1_page, (cpcache_t c, int32_t slot, void **page, size_t *len), (c, slot, page, len))
CPCACHE_ENTRY(get_stats, (cpcache_t c, cpcache_stats *stats), (c, stats))
CPCACHE_ENTRY(metrics_text, (cpcache_t c, char *buf, size_t cap, size_t *len), (c, buf, cap, len))
#ifdef CPCACHE_ENTRY_PIDCHECK_DEFAULTED
#undef CPCACHE_ENTRY_PIDCHECK
#undef CPCACHE_ENTRY_PIDCHECK_DEFAULTED
#endif
