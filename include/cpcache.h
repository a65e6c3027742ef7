/*
 * cpcache.h — the C ABI of libcpcache: cpcache's hierarchical KV cache for context-parallel
 * (CP) groups, for engines written in C, C++ or Python (ctypes). Link with -lcpcache
 * (libcpcache.so) or with libcpcache.a plus the libraries CMake's cpcache::cpcache_static
 * names. Hand-written and stable: CPCACHE_ABI_VERSION changes only when a declaration here
 * changes incompatibly.
 *
 * Conventions
 *   - Every function returns a status: CPCACHE_OK (0) or a negative CPCACHE_ERR_* code; out
 *     parameters are written only on success. cpcache_last_error() returns the message of
 *     the last failed call on the calling thread.
 *   - Handles (cpcache_t, cpcache_node_t) are opaque integers; 0 is never a valid cache.
 *     No memory owned by the library's runtime crosses the boundary: every pointer the
 *     library returns (cpcache_l1_page) points into memory the caller or the library
 *     allocated outside any garbage collector, valid until cpcache_close.
 *   - Bad calls (NULL pointers, wrong struct sizes, buffers that are too small, slots or
 *     nodes out of range, calls after close, a second open) return an error code and change
 *     nothing; they never crash the process.
 *   - Fork: the library's runtime (Go's) does not survive fork(): in a child forked after the
 *     library was loaded (os.fork(), multiprocessing's fork start method), every function
 *     that returns a status returns CPCACHE_ERR_FORKED at once, before reading its
 *     arguments, and cpcache_last_error() names the parent's pid. cpcache_close in the child
 *     returns it too and touches nothing the parent owns (its slabs, store keys, sockets,
 *     L1), so the parent's cache keeps working; cpcache_version, cpcache_abi_version and
 *     cpcache_last_error answer from C storage. Open the cache in a process started fresh
 *     (multiprocessing's spawn start method) or load the library after the fork. The check is
 *     a flag set by a pthread_atfork handler (under a nanosecond per call); cpcache_open and
 *     cpcache_close also compare getpid() with the pid recorded at load, which catches a
 *     child made by a raw clone() that skips the handlers.
 *
 * Replicated and local calls (see hicache/doc.go). The ranks of a replica group (the
 * attention-DP block: attn_cp × attn_tp ranks) hold identical cache metadata because they
 * run the same scheduler:
 *   [R] replicated: every rank of the replica group makes the call, in the same order, with
 *       the same arguments. Results (node handles, page counts, a fill page's slot and owner)
 *       are equal on every rank, except what names this rank's own L1: each CP rank's pool
 *       holds only the pages it owns (page i of a sequence is CP rank i mod cp_size's), so
 *       cpcache_match's l1_slots (and the locations of cpcache_match_locs) are this rank's,
 *       -1 for the pages another CP rank owns, and a fill page is `owned` on its owner only.
 *       Skipping one on one rank is a divergence the next step detects.
 *   [L] local: this rank only; never waits on another rank.
 *   [C] collective: like [R], and it also waits for every rank of the job (open) or group.
 *
 * Thread safety: every function may be called from any thread; calls on one cache are
 * serialised by a lock, which cpcache_step and cpcache_flush release while they wait for
 * peers and cpcache_wait_l1 while it waits for copies (so [L] calls answer meanwhile). The
 * [R] calls of a cache must be issued by one scheduler thread (their order is part of the
 * replicated state); one made while this rank's step waits fails with CPCACHE_ERR_BUSY.
 *
 * Usage loop (one scheduler step, every rank):
 *   for each new request:  cpcache_match [R] → cpcache_lock [R] → cpcache_load_back [R];
 *                          cpcache_step until cpcache_load_pending [R] says 0 (the group
 *                          agreed the loads are over), then cpcache_match again (every rank
 *                          gets the same hit); the model calls cpcache_wait_l1 [L] before
 *                          reading the loaded prefix
 *   after its prefill:     cpcache_insert [R] → write the KV of every fill page this rank
 *                          owns into its L1 slot (before the next step)
 *   when it finishes:      cpcache_unlock [R]
 *   once per step:         cpcache_step [R] — always, even when nothing is pending
 *   when idle:             cpcache_flush [C]
 *   any time:              cpcache_get_stats [L], cpcache_get_info [L], cpcache_metrics_text [L]
 */
#ifndef CPCACHE_H
#define CPCACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version of this header; cpcache_abi_version() returns the library's. */
#define CPCACHE_ABI_VERSION 3
/* Compatibility: cpcache_open takes a config of this header (struct_size
 * sizeof(cpcache_config), abi_version 3) or one built against an older header: an ABI-1
 * config (struct_size CPCACHE_CONFIG_SIZE_V1, abi_version 1) or an ABI-2 one (struct_size
 * CPCACHE_CONFIG_SIZE_V2, abi_version 2). Its fields are read as they were; the newer ones
 * take their defaults: ABI 2's (KV layout, L1 buffers, L2 layout, L1 mode) opaque pages, the
 * pool of l1_kind, page_first, cache-owned slots; ABI 3's (store, job_id, local_world, KV
 * events, metrics_addr) none.
 * Any other pair is CPCACHE_ERR_SIZE. */
#define CPCACHE_CONFIG_SIZE_V1 offsetof(cpcache_config, kv_layout)
#define CPCACHE_CONFIG_SIZE_V2 offsetof(cpcache_config, store)

/* Status codes. */
#define CPCACHE_OK 0
#define CPCACHE_ERR_INVALID (-1)      /* a NULL pointer or a bad value (named in the message) */
#define CPCACHE_ERR_SIZE (-2)         /* a struct_size that is not this header's, a short buffer */
#define CPCACHE_ERR_RANGE (-3)        /* an L1 slot or page index out of range */
#define CPCACHE_ERR_CLOSED (-4)       /* a cache handle that was closed or never opened */
#define CPCACHE_ERR_ALREADY_OPEN (-5) /* a second open while this process has a cache */
#define CPCACHE_ERR_CONFIG (-6)       /* configuration rejected (layout, sizes, ranks disagree,
                                       * a rendezvous store another job is joining through, no
                                       * loadable CUDA driver for a device L1 or CUDA slabs) */
#define CPCACHE_ERR_NODE (-7)         /* a node handle that is not in the tree (evicted, flushed) */
#define CPCACHE_ERR_L1_FULL (-8)      /* L1 cannot make room (insert, load-back) */
#define CPCACHE_ERR_BUSY (-9)         /* flush while busy; a replicated call while a step waits */
#define CPCACHE_ERR_DIVERGED (-10)    /* placement digests differ: L2 is off until a flush */
#define CPCACHE_ERR_PEER_LOST (-11)   /* a rank of a group exited */
#define CPCACHE_ERR_TIMEOUT (-12)     /* a collective or a wait passed its deadline */
#define CPCACHE_ERR_IO (-13)          /* a transfer (copy) failed on this rank */
#define CPCACHE_ERR_NOT_STARTED (-14) /* wait_l1 before the step that starts the load */
#define CPCACHE_ERR_FORKED (-15)      /* this process was forked after the library was loaded */
#define CPCACHE_ERR_INTERNAL (-100)   /* a bug: the message says where */

/* Handles. */
typedef uint64_t cpcache_t;      /* one open cache; 0 is never valid */
typedef uint64_t cpcache_node_t; /* a node of the tree; equal on every rank of the replica group */

/* Where the L2 slabs live. */
#define CPCACHE_SLAB_HOST 0     /* host shared memory (/dev/shm) */
#define CPCACHE_SLAB_CUDA_IPC 1 /* device memory exported with CUDA IPC (one process per rank) */

/* The L1 pool: this rank's KV pages, page slot s at base + s × page_bytes. */
#define CPCACHE_L1_ALLOC 0  /* the library allocates host memory (see cpcache_l1_page) */
#define CPCACHE_L1_HOST 1   /* l1_base is host memory the engine owns */
#define CPCACHE_L1_DEVICE 2 /* l1_base is a CUDA device pointer on `device` the engine owns
                             * (NULL with device l1_buffers) */

/* How attention-TP ranks hold a KV part (cpcache_kv_part.sharding). */
#define CPCACHE_KV_SHARDED 1    /* each attention-TP rank holds 1/attn_tp of its bytes (K, V of MHA/GQA) */
#define CPCACHE_KV_REPLICATED 2 /* every attention-TP rank holds all of it (an MLA latent) */

/* One part of every layer's KV (K, V, an MLA latent, a side buffer). */
typedef struct cpcache_kv_part {
  const char *name;        /* unique: letters, digits, '_', '-', '.', starting with a letter */
  int64_t bytes_per_token; /* one token of one layer, all heads (all attention-TP ranks) */
  int32_t sharding;        /* CPCACHE_KV_* */
  int32_t reserved;        /* 0 */
} cpcache_kv_part;

/* L2 layouts (cpcache_config.l2_layout). */
#define CPCACHE_L2_PAGE_FIRST 1  /* a page holds every layer (the default; storage's value) */
#define CPCACHE_L2_LAYER_FIRST 2 /* a slab holds, per layer, that layer of all its pages */

/* Where an L1 buffer lives (cpcache_l1_buffer.kind). */
#define CPCACHE_MEM_HOST 1
#define CPCACHE_MEM_DEVICE 2 /* a CUDA device pointer on `device` */

/* One (layer, part) buffer of the engine's L1, lent by the engine: token k of page slot s
 * is at base + s × page_stride + k × token_stride, for the part's bytes per token on this
 * rank. Every (layer, part) exactly once, all of one kind, no two sharing a byte (buffers of
 * one page stride may interleave: K and V of one block-major tensor, or K and V in disjoint
 * columns of one [tokens, 2 × row] array, with one token_stride), each holding l1_pages
 * slots, and a token_bytes that is set equal to the part's bytes per token on this rank (a
 * sharded part's bytes divided by attention-TP): cpcache_open checks, naming the layer and
 * part (and both sizes), before any rank talks to another, or once the job's attention-TP
 * size is known where the world is the launcher's. Host buffers take l1_kind CPCACHE_L1_ALLOC; device buffers (CPCACHE_MEM_DEVICE,
 * the engine's device memory on `device`) take l1_kind CPCACHE_L1_DEVICE with pinned host
 * slabs (pin_host 1) or CUDA IPC slabs: the CUDA engine copies chunk by chunk and loads
 * layer by layer (cpcache_wait_l1_layer_on). Without a loadable CUDA driver open fails on
 * every rank: CPCACHE_ERR_CONFIG naming the device buffers where the driver did not load,
 * CPCACHE_ERR_PEER_LOST (a failed peer) on a rank whose driver did. */
typedef struct cpcache_l1_buffer {
  int32_t layer, part; /* part: index in the layout's parts */
  int32_t kind;        /* CPCACHE_MEM_* */
  int32_t token_bytes; /* the bytes one token's row of the engine's array holds (its non-token
                        * dimensions × element size): must equal the part's bytes per token on
                        * this rank, so that no part of a row goes uncached. 0: not known, not
                        * checked (a row padded wider than the part). */
  void *base;
  int64_t bytes;        /* size of the buffer */
  int64_t page_stride;  /* bytes from slot s to s + 1 */
  int64_t token_stride; /* bytes from token k to k + 1 of a slot (>= bytes per token) */
} cpcache_l1_buffer;

/* SGLang's token-slot buffer ([slots × page_tokens, heads, head_dim] of one layer and part,
 * row_bytes = heads × head_dim × element size on this rank): strides of a dense tensor. */
static inline cpcache_l1_buffer cpcache_l1_token_slot_buffer(int32_t layer, int32_t part, int32_t kind, void *base,
                                                             int64_t slots, int32_t page_tokens, int64_t row_bytes) {
  cpcache_l1_buffer b = {layer, part, kind, (int32_t)row_bytes, base, slots * page_tokens * row_bytes, page_tokens * row_bytes,
                         row_bytes};
  return b;
}

/* vLLM's block-major layer tensor [blocks, 2, page_tokens, heads, head_dim]: K (kv 0) or V
 * (kv 1) of one layer, row_bytes = heads × head_dim × element size on this rank; the two
 * interleave in one tensor of blocks × 2 × page_tokens × row_bytes bytes at base. */
static inline cpcache_l1_buffer cpcache_l1_block_major_buffer(int32_t layer, int32_t part, int32_t kind, void *base,
                                                              int64_t blocks, int32_t page_tokens, int64_t row_bytes,
                                                              int kv) {
  int64_t half = (int64_t)page_tokens * row_bytes;
  cpcache_l1_buffer b = {layer, part, kind, (int32_t)row_bytes, (char *)base + kv * half, blocks * 2 * half - kv * half,
                         2 * half, row_bytes};
  return b;
}

/* L1 slot modes (cpcache_config.l1_mode). */
#define CPCACHE_L1_CACHE_OWNED 0
#define CPCACHE_L1_ENGINE_OWNED 1

/* Write policies. */
#define CPCACHE_POLICY_WRITE_THROUGH 0
#define CPCACHE_POLICY_WRITE_THROUGH_SELECTIVE 1
#define CPCACHE_POLICY_WRITE_BACK 2

/* A rendezvous store the caller runs (an engine's torch.distributed.Store, its own
 * key-value service), as callbacks: what the ranks of a job meet through instead of a store
 * URL (cpcache_config.store). Every key the library writes starts with "cpcache/", so the
 * caller's own keys are never touched. A key is key_len bytes (also NUL-terminated).
 *   set: create or replace key with value[0..value_len).
 *   get: wait up to timeout_ms (0: no wait) for key; when present, write its length to *len
 *        and, when it fits (*len <= cap), its value to buf[0..*len): CPCACHE_STORE_OK. A value
 *        that does not fit: the library calls get again with a buffer of *len bytes (values
 *        above CPCACHE_STORE_MAX_VALUE are an error). Still absent: CPCACHE_STORE_ABSENT.
 *   add: add delta to the counter at key (absent: 0; its value is the decimal text, as
 *        torch's stores keep it) and write the new value to *value; add 0 reads it.
 *   del: remove key (a missing key is not an error).
 * Each returns CPCACHE_STORE_OK, CPCACHE_STORE_ABSENT (get only) or CPCACHE_STORE_ERROR with
 * a NUL-terminated message in err[0..err_len).
 * Threads: the callbacks are called from the library's threads, not only the thread of
 * cpcache_open, possibly several at once, during cpcache_open and cpcache_close (and never
 * between). Each call is bounded by the rendezvous deadline (timeout_ms): one that has not
 * returned by then is abandoned (cpcache_open fails with CPCACHE_ERR_TIMEOUT) and its result
 * dropped when it returns. The struct is copied at open; ctx and the functions must stay
 * valid until cpcache_close returns, and for as long as an abandoned call may still run. */
#define CPCACHE_STORE_OK 0
#define CPCACHE_STORE_ABSENT 1
#define CPCACHE_STORE_ERROR (-1)
#define CPCACHE_STORE_MAX_VALUE (1 << 20)
typedef struct cpcache_store {
  void *ctx; /* passed to every callback */
  int (*set)(void *ctx, const char *key, size_t key_len, const void *value, size_t value_len, char *err,
             size_t err_len);
  int (*get)(void *ctx, const char *key, size_t key_len, int64_t timeout_ms, void *buf, size_t cap, size_t *len,
             char *err, size_t err_len);
  int (*add)(void *ctx, const char *key, size_t key_len, int64_t delta, int64_t *value, char *err, size_t err_len);
  int (*del)(void *ctx, const char *key, size_t key_len, char *err, size_t err_len);
} cpcache_store;

/* Configuration of cpcache_open. Fill it with cpcache_config_init, then set fields. */
typedef struct cpcache_config {
  uint32_t struct_size; /* sizeof(cpcache_config), set by cpcache_config_init */
  uint32_t abi_version; /* CPCACHE_ABI_VERSION, set by cpcache_config_init */

  /* Parallel layout (SGLang's rules; see `cpcache layout`). world 0: the launcher's. */
  int32_t world, tp, dp, attn_cp, ep;
  int32_t dp_attention; /* 0 or 1 (default 1, as the cpcache commands: each DP replica runs attention on its own ranks) */

  /* This process's rank: -1 (default) reads the launcher's environment (torchrun, OpenMPI,
   * Slurm variables, as `cpcache launch` and mpirun set them). */
  int32_t rank;
  /* Rendezvous store URL (file:///dir or redis://host:port[/prefix]); NULL: the store
   * callbacks (store, ABI 3), else CPCACHE_STORE. Variables (CPCACHE_STORE, CPCACHE_JOB_ID,
   * the launcher's) are read from the process's environment as it is when cpcache_open is
   * called (setenv/putenv before it count). */
  const char *store_url;
  /* Consensus backend: NULL or "auto" (shared memory on one host, else Gloo), "shm", "gloo". */
  const char *consensus;
  int64_t timeout_ms; /* deadline of each collective (default 60000) */

  /* Page geometry: tokens per page and bytes of one rank's KV shard of a page. */
  int32_t page_tokens; /* default 16 */
  int64_t page_bytes;  /* required */

  /* L2: slabs of the CP group, l2_pages pages each. */
  int32_t slab_backend; /* CPCACHE_SLAB_* */
  int32_t device;       /* CUDA device ordinal (CUDA IPC slabs, device L1) */
  int32_t pin_host;     /* host slabs: register with CUDA as pinned memory (required with a device L1) */
  int64_t l2_pages;     /* required */

  /* L1: l1_pages pages of page_bytes at l1_base (not used with CPCACHE_L1_ALLOC). */
  int32_t l1_kind; /* CPCACHE_L1_* */
  void *l1_base;
  int64_t l1_pages; /* required */

  /* Cache policy. */
  int32_t policy;           /* CPCACHE_POLICY_* */
  int32_t write_threshold;  /* write_through_selective: insertions before a backup (default 2) */
  int32_t min_load_pages;   /* load back host hits of at least this many pages (default 1) */
  int32_t load_quota_pages; /* pages loading at once, over the CP group (default: half of the
                             * group's L1, cp_size × l1_pages / 2: each CP rank's pool holds the
                             * pages it owns; see cpcache_load_back) */

  /* Optional L3 storage below L2 (NULL: none): file:///dir or redis://host:port/prefix.
   * model names the KV content (with the page geometry and TP size it scopes the keys).
   * Every rank needs the same storage_url, model and MAC key ($CPCACHE_STORAGE_KEY_FILE):
   * open compares them across the job, and a rank that cannot open the storage fails the
   * open of every rank, with its cause. */
  const char *storage_url;
  const char *model;

  /* --- ABI 2 --- */
  /* KV layout (NULL and kv_num_parts 0: pages are opaque blobs of page_bytes). kv_layout is a
   * preset name (`cpcache layout --models`: llama-3-8b, deepseek-v3, ...) or a spec such as
   * "layers=32;k=2048:sharded;v=2048:sharded"; or kv_parts[kv_num_parts] with kv_num_layers.
   * Checked at open (the error names the bad part) and compared across the job
   * (CPCACHE_ERR_CONFIG naming the first differing part: its name, bytes per token, sharding); with a layout, page_bytes 0 takes this rank's
   * bytes of a page (at the attention-TP size of the world, explicit or the launcher's), and
   * any other value must equal it. */
  const char *kv_layout;
  const cpcache_kv_part *kv_parts;
  int32_t kv_num_parts;
  int32_t kv_num_layers;
  /* The engine's L1 as per-(layer, part) buffers (needs a layout; l1_base NULL and l1_kind
   * CPCACHE_L1_ALLOC for host buffers, CPCACHE_L1_DEVICE for device buffers: these replace
   * the pool). NULL: the pool of l1_kind. A missing (layer, part), a buffer too small for
   * l1_pages slots, two buffers sharing a byte or a token_bytes other than the part's bytes
   * per token on this rank are CPCACHE_ERR_INVALID naming the buffer,
   * before any rank talks to another, under a launcher's world (world 0: its size read from
   * the environment) as under an explicit one. */
  const cpcache_l1_buffer *l1_buffers;
  int32_t l1_num_buffers;
  int32_t l2_layout; /* CPCACHE_L2_*; 0: page_first. Every rank must choose the same. */
  /* Who picks L1 slots: CPCACHE_L1_CACHE_OWNED (0, the default: cpcache_insert and
   * cpcache_load_back choose them) or CPCACHE_L1_ENGINE_OWNED (the engine's allocator
   * chooses them: cpcache_insert_slots, cpcache_load_back_slots, cpcache_evict_l1_slots,
   * cpcache_take_freed_l1). Every rank of a replica group must choose the same. ABI-1
   * configs get the default. */
  int32_t l1_mode;

  /* --- ABI 3 --- */
  /* The rendezvous store as callbacks (see cpcache_store), instead of store_url: NULL (the
   * default) uses store_url. Not with store_url (CPCACHE_ERR_INVALID naming both). */
  const cpcache_store *store;
  /* This job's id: every rank of a job gives the same one, and two jobs meeting through one
   * store at once different ones (NULL: $CPCACHE_JOB_ID, else the launcher's job id). Two
   * processes of one job id given the same rank fail with CPCACHE_ERR_CONFIG saying so. */
  const char *job_id;
  /* The number of this job's ranks on this machine, with an explicit world and rank (0:
   * unknown). local_world == world: every rank is on this machine, and the ranks connect over
   * 127.0.0.1. */
  int32_t local_world;
  /* KV events, published as `cpcache run --kv-events` publishes them (vLLM's ZMQ format:
   * BlockStored, BlockRemoved, AllBlocksCleared; see docs/operating.md, "KV events"): the first rank of
   * each replica group publishes its replica's on kv_events_endpoint (NULL: none): bound when
   * its host is a wildcard (* or [::]) or it is ipc:// or inproc://, else connected to a
   * subscriber that binds (tcp://host:5557); replica d on the tcp port plus d. kv_events_replay_endpoint (bound;
   * NULL: none) answers replay requests from a bounded history (64 MiB); kv_events_topic is
   * every message's first frame (NULL: ""). Every rank gives the same. A malformed endpoint,
   * one that cannot be bound or numbered for the last replica, or a replay endpoint without an
   * endpoint is CPCACHE_ERR_INVALID naming the field and value, before any rank talks to
   * another; libzmq (Debian's libzmq5) is loaded only with an endpoint (CPCACHE_ERR_CONFIG
   * without it). */
  const char *kv_events_endpoint;
  const char *kv_events_replay_endpoint;
  const char *kv_events_topic;
  /* A TCP address (host:port; port 0 picks one) where this rank serves its metrics on
   * /metrics over HTTP (Prometheus text: cpcache_metrics_text's, plus this process's Go and
   * process collectors) until cpcache_close; NULL: none. A bad or busy address is
   * CPCACHE_ERR_INVALID naming it, before any rank talks to another. */
  const char *metrics_addr;
} cpcache_config;

/* Static facts about an open cache (cpcache_get_info). */
typedef struct cpcache_info {
  uint32_t struct_size;
  int32_t rank, world;       /* global rank and world size */
  int32_t cp_rank, cp_size;  /* index in the slab (attention-CP) group, its size */
  int32_t tp_rank;           /* attention-TP index: which shard of a page's KV this rank holds */
  int32_t dp_rank;           /* DP replica (attention-DP block) */
  int32_t replica_size;      /* ranks of the replica group (consensus) */
  int32_t page_tokens;
  int64_t page_bytes, l1_pages, l2_pages;
  void *l1_base;             /* the L1 pool (NULL for none the caller can address) */
  const char *consensus;     /* "shm" or "gloo"; static storage */
} cpcache_info;

/* Result of cpcache_match. */
typedef struct cpcache_match_result {
  cpcache_node_t node;  /* the deepest node of the hit (lock it while the request runs) */
  int64_t device_pages; /* leading pages held in L1 (their slots go to l1_slots) */
  int64_t host_pages;   /* following pages held only in L2: cpcache_load_back brings them
                         * (within its quota and L1; see there) */
} cpcache_match_result;

/* A page an insert gave an L1 slot: the rank that owns it writes its KV there. */
typedef struct cpcache_fill_page {
  int32_t slot;   /* L1 slot */
  int32_t owner;  /* CP rank that holds it: index mod cp_size */
  int64_t index;  /* page index in the sequence */
  uint64_t hash;  /* first 8 bytes (little endian) of the page's 256-bit id: a well-mixed
                     index, not an identity (two pages may share it) */
  int32_t owned;  /* 1 when this rank is the owner */
  int32_t _pad;
} cpcache_fill_page;

/* Result of cpcache_insert. */
typedef struct cpcache_insert_result {
  cpcache_node_t node; /* the deepest node of the inserted prefix */
  int64_t pages;       /* leading whole pages now in the tree */
  int64_t n_fill;      /* entries written to fill */
  int64_t backups;     /* backups this insert started */
} cpcache_insert_result;

/* Counters (cpcache_get_stats). Agreed counters are equal on every rank of the replica group;
 * the others are this rank's own. */
typedef struct cpcache_stats {
  uint32_t struct_size;
  int64_t matches, inserts;                   /* agreed */
  int64_t l1_hit_pages, l2_hit_pages;         /* agreed */
  int64_t inserted_pages;                     /* agreed */
  int64_t written_pages, loaded_pages;        /* agreed: committed backups, finished loads */
  int64_t evicted_l1_pages, evicted_l2_pages; /* agreed */
  int64_t steps, digest_checks, digest_mismatches;
  int64_t collectives;                         /* this rank's collectives (one per step + open, flush) */
  int64_t pages_written_l2, pages_loaded_l2;   /* this rank's page copies */
  int64_t transfer_errors;
  int64_t l1_used, l2_free_pages, nodes, pending;
  int64_t l2_enabled;                          /* 0 after a divergence, until a flush */
  int64_t consensus_latency_median_ns, consensus_latency_p99_ns;
  int64_t storage_hit_pages, storage_prefetched_pages, storage_backed_up_pages; /* agreed */
  int64_t storage_errors;                      /* this rank's */
  /* Stretches in which copies or storage I/O stayed pending longer than CPCACHE_STEP_WARN_MS
   * (default 5000) with no cpcache_step on this rank: they start only at a step. The first
   * is also logged on stderr. (Appended: a struct_size that ends before it is accepted.) */
  int64_t no_step_warnings;
} cpcache_stats;

#ifndef CPCACHE_NO_PROTOTYPES /* defined only where the library itself is compiled */

/* --- library --- */

/* The library's version string ("cpcache x.y.z"); static storage. [L] */
const char *cpcache_version(void);
/* The library's CPCACHE_ABI_VERSION. [L] */
int cpcache_abi_version(void);
/* The message of the last failed call on this thread ("" if none); valid until the
 * thread's next failed call. [L] */
const char *cpcache_last_error(void);

/* --- lifetime --- */

/* Fills cfg with the defaults and sets struct_size and abi_version. [L] */
int cpcache_config_init(cpcache_config *cfg);
/* Joins the job: rendezvous on the store, the layout's groups, the slab set of this rank's
 * CP group, the cache; checks that every rank is configured alike: across the job world,
 * tp, dp, attn_cp, ep, dp_attention, consensus, timeout_ms, storage_url, model and the
 * storage's MAC key; across each replica group page_tokens, page_bytes, slab_backend,
 * l1_pages, l2_pages, policy, write_threshold, min_load_pages and load_quota_pages (rank,
 * store_url, store, local_world, device, pin_host, l1_kind and l1_base are each rank's own). A difference fails
 * every rank with CPCACHE_ERR_CONFIG naming the field and two ranks' values (a URL's
 * password masked), before any group is made. A rendezvous store (store_url, store or
 * CPCACHE_STORE) that another job is joining through at the same time (the same store and the
 * same job id, or none on both) fails at once with CPCACHE_ERR_CONFIG: give each job its
 * own store, or its ranks a job id of their own (job_id, CPCACHE_JOB_ID); a process given a
 * rank another process of its job holds fails the same way, naming the rank and job. One cache per process: a second open
 * before cpcache_close fails with CPCACHE_ERR_ALREADY_OPEN. [C: every rank of the job] */
int cpcache_open(const cpcache_config *cfg, cpcache_t *out);
/* Cancels transfers that have not started, waits for running ones, and releases the cache,
 * its slabs, groups and L1 allocation. Closing a closed handle is CPCACHE_OK; every other
 * call on it returns CPCACHE_ERR_CLOSED. Call it on every rank at the end (peers see a
 * closed rank as lost). [L]; but when another thread is inside a collective (cpcache_step,
 * cpcache_flush) on Gloo consensus, which cannot be cancelled once started, it waits for that
 * collective to end: until the peers take part, at most timeout_ms. */
int cpcache_close(cpcache_t c);
/* Interrupts this rank: cancels the collective that cache c waits in (cpcache_step,
 * cpcache_flush, on another thread), which then returns at once with an error, and closes
 * the cache as cpcache_close does; its peers see this rank leave (CPCACHE_ERR_PEER_LOST),
 * promptly rather than at their deadline. For a signal handler's thread or a watchdog: a
 * Python binding calls it on KeyboardInterrupt. c 0 cancels the cpcache_open in flight on
 * another thread instead (its rendezvous returns CPCACHE_ERR_PEER_LOST). Bounded: with
 * shared-memory consensus within a poll interval; a Gloo collective that has started cannot
 * be cancelled, and the close then waits for it to end (at most timeout_ms). Aborting a
 * closed handle is CPCACHE_OK. [L] */
int cpcache_abort(cpcache_t c);
/* Static facts about the cache. info->struct_size must be sizeof(cpcache_info). [L] */
int cpcache_get_info(cpcache_t c, cpcache_info *info);
/* This rank's KV bytes per token (all layers and parts, sharded parts divided by attn_tp)
 * and per page (× page_tokens); without a layout, CPCACHE_ERR_INVALID. [L] */
int cpcache_kv_bytes_per_token(cpcache_t c, int64_t *out);
int cpcache_kv_page_bytes(cpcache_t c, int64_t *out);

/* --- the scheduler's calls --- */

/* The longest cached prefix of tokens[0..n) (whole pages), marked recently used. The L1
 * slots of the device pages go to l1_slots (this rank's slots: -1 for the pages it does not
 * own, page i being CP rank i mod cp_size's; each rank's L1 holds only its own pages), which must hold n / page_tokens entries (or be
 * NULL with slots_cap 0 when they are not wanted); slots_cap is a bound (any larger value,
 * SIZE_MAX included, is fine): only the device_pages entries returned are written. n is at
 * most 2^40. [R] */
int cpcache_match(cpcache_t c, const int32_t *tokens, size_t n, cpcache_match_result *out,
                  int32_t *l1_slots, size_t slots_cap);
/* Pins (unpins) node's prefix against eviction while a request uses it. [R] */
int cpcache_lock(cpcache_t c, cpcache_node_t node);
int cpcache_unlock(cpcache_t c, cpcache_node_t node);
/* Allocates L1 slots for the L2-only pages of node's prefix (node: a match's node, whose
 * prefix ends where the hit does: a match that ends inside a node held only in L2 splits it
 * there) and starts loading them; *pages (may be NULL) is the number of pages that will
 * load: the leading host_pages of the match, at most the load quota left (load_quota_pages,
 * default half of the CP group's L1, cp_size × l1_pages / 2, minus the pages loading) and
 * the L1 pages free once unlocked pages off the prefix were evicted for them. When that cuts
 * the hit inside a node, the node is split and its head loads; call again (after the loads
 * are over) for the rest. Example: l1_pages 32, nothing loading: at CP1 a 20-page host hit
 * loads 16 pages, then 4; at CP4 (quota 64) an 80-page host hit loads 64, then 16. Nothing loads
 * (*pages 0) below min_load_pages; CPCACHE_ERR_L1_FULL when L1 cannot make room for
 * min_load_pages. This rank's copies start at the next cpcache_step (after the group
 * checked the state they were chosen from). [R] */
int cpcache_load_back(cpcache_t c, cpcache_node_t node, int64_t *pages);
/* *pending = 1 while the group has not agreed that every load on node's prefix is over. Once
 * it is 0, a load that failed on any rank has made its pages unservable on every rank, and
 * cpcache_match of the same tokens gives every rank the same hit. The copies start only at
 * the next cpcache_step and are agreed over at a later one: a wait loop must step
 * ("while pending: cpcache_step"), or it never ends. [R] */
int cpcache_load_pending(cpcache_t c, cpcache_node_t node, int32_t *pending);
/* Waits until this rank's copies of every load on node's prefix finished, at most
 * timeout_ms (< 0, or INT64_MAX: no limit). Call before a layer reads the prefix from L1,
 * after the step that follows cpcache_load_back (before it: CPCACHE_ERR_NOT_STARTED at
 * once). A failed copy is reported here on this rank only; act on cpcache_load_pending and
 * cpcache_match. [L] */
int cpcache_wait_l1(cpcache_t c, cpcache_node_t node, int64_t timeout_ms);
/* Layer-wise load-back: cpcache_wait_l1 for one layer. Waits until layer `layer` of this
 * rank's copies of every load on node's prefix landed in L1, at most timeout_ms, so that the
 * layer's attention reads the prefix while the later layers still copy (an engine that loads
 * layer by layer copies layer 0 of every page first). With an engine that loads whole pages
 * it waits for the whole load, whatever the layer. The other rules are cpcache_wait_l1's
 * (CPCACHE_ERR_NOT_STARTED before the step that starts the loads, a failed copy reported on
 * this rank only); a negative layer, or one past a layer-wise load's layers:
 * CPCACHE_ERR_INVALID. [L] */
int cpcache_wait_l1_layer(cpcache_t c, cpcache_node_t node, int32_t layer, int64_t timeout_ms);
/* The same wait without blocking the calling thread, for a device L1: the CUDA stream
 * `stream` (a CUstream / cudaStream_t; NULL is the legacy default stream) waits for layer
 * `layer` of the loads on node's prefix (cuStreamWaitEvent on the event the engine records
 * after copying that layer), so kernels enqueued on it afterwards read the loaded layer. It
 * returns at once. CPCACHE_ERR_CONFIG when the cache's L1 is not device memory (use
 * cpcache_wait_l1_layer); a load that already failed: CPCACHE_ERR_IO, nothing enqueued. The
 * other rules are cpcache_wait_l1_layer's. [L] */
int cpcache_wait_l1_layer_on(cpcache_t c, cpcache_node_t node, int32_t layer, void *stream);
/* Caches the whole pages of tokens[0..n). The pages that got L1 slots go to fill, which
 * must hold n / page_tokens entries (fill_cap is a bound, as slots_cap: only the n_fill
 * entries returned are written); the rank that owns each (fill[i].owned) writes its KV
 * into the slot before the next cpcache_step. CPCACHE_ERR_L1_FULL when L1 cannot make
 * room. [R] */
int cpcache_insert(cpcache_t c, const int32_t *tokens, size_t n, cpcache_insert_result *out,
                   cpcache_fill_page *fill, size_t fill_cap);
/* Isolation keys: cpcache_match_key, cpcache_insert_key and cpcache_prefetch_key are
 * cpcache_match, cpcache_insert and cpcache_prefetch under the isolation key
 * key[0..key_len) (any bytes, at most 4096; NULL with key_len 0, like the unkeyed calls, is
 * the empty key). The key seeds the page ids (256-bit SHA-256 chained over the prefix, from
 * which fill[i].hash and the storage keys derive), so equal tokens under different keys
 * share no page in L1, L2 or storage: a tenant or LoRA adapter matches only what was cached
 * under its own key, and finding two prefixes (or keys) with one id takes a SHA-256
 * collision. [R] */
int cpcache_match_key(cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
                      cpcache_match_result *out, int32_t *l1_slots, size_t slots_cap);
int cpcache_insert_key(cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
                       cpcache_insert_result *out, cpcache_fill_page *fill, size_t fill_cap);
/* Evicts up to pages L1 pages, least recently used unlocked leaves first, never more (a
 * longer leaf gives only its last pages). *freed (may be NULL) is the pages whose slots are
 * free now. Under write_back a page without an L2 copy is backed up first and its slot
 * frees at the step that commits the backup: such pages are not in *freed but in
 * cpcache_evict_l1_ex's *pending. [R] */
int cpcache_evict_l1(cpcache_t c, int64_t pages, int64_t *freed);
/* cpcache_evict_l1 that also reports *pending (may be NULL): the pages of the request whose
 * write-back is in flight, their slots free at the step that commits it (0 except under
 * write_back). Pages still pending from earlier calls count toward pages, so a request
 * repeated while they are written starts no more: *freed + *pending <= pages, equal unless
 * nothing else could be evicted (locked, loading, or the parent of a page being written
 * back). Example, write_back, one unlocked 8-page leaf: evict_l1_ex(2) gives freed 0,
 * pending 2 and starts the backup of its last 2 pages; evict_l1_ex(2) again gives 0, 2 and
 * starts nothing; after the step that commits it, L1 has 2 more free pages. [R] */
int cpcache_evict_l1_ex(cpcache_t c, int64_t pages, int64_t *freed, int64_t *pending);

/* --- engine-owned L1 slots (l1_mode CPCACHE_L1_ENGINE_OWNED) --- */
/* The engine's allocator gives each rank slots only for the pages it owns (page i of a
 * sequence is CP rank i mod cp_size's), before the forward pass writes their KV; the cache
 * adopts them and hands back, as lists, every slot it lets go. In this mode cpcache_insert
 * and cpcache_load_back are CPCACHE_ERR_INVALID. A slot list that is wrong (a count other
 * than this rank's pages, a slot outside [0, l1_pages), a slot twice, a slot the cache holds
 * for another page) is CPCACHE_ERR_INVALID naming the slot and its entry, before any change.
 * Freed-slot buffers: *n_freed is the number of slots freed; the first min(*n_freed,
 * freed_cap) go to freed, and the rest (when *n_freed > freed_cap) stay queued for
 * cpcache_take_freed_l1: nothing is lost, and the call still succeeds (it took effect on
 * every rank). freed may be NULL with freed_cap 0 (everything queued). */

/* cpcache_insert (under the isolation key key[0..key_len), as cpcache_insert_key) with this
 * rank's slots: slots[0..n_slots) are, in order, one for every whole page of tokens this rank
 * owns, holding the KV the engine computed (for pages cpcache_match served from L1, the slot
 * it reported). The cache keeps the slots of the pages it caches; the others (a page already
 * in L1 elsewhere, a quarantined cache) and slots the insert's evictions freed are the freed
 * slots. *out as cpcache_insert's (n_fill 0). On CPCACHE_ERR_L1_FULL the
 * caller keeps its slots (evictions' slots wait in cpcache_take_freed_l1). [R] */
int cpcache_insert_slots(cpcache_t c, const void *key, size_t key_len, const int32_t *tokens,
                         size_t n, const int32_t *slots, size_t n_slots, cpcache_insert_result *out,
                         int32_t *freed, size_t freed_cap, size_t *n_freed);
/* The pages a cpcache_load_back_slots of node would load at most, as sequence page indices
 * this rank owns, in order: *n_pages is their count, the number of slots to pass; they go to
 * pages (which may be NULL with pages_cap 0 to ask only the count). pages_cap below the count
 * is CPCACHE_ERR_SIZE with *n_pages set. Read-only. [L, but call it identically on every rank
 * before cpcache_load_back_slots: the plan is the same everywhere] */
int cpcache_load_back_plan(cpcache_t c, cpcache_node_t node, int64_t *pages, size_t pages_cap,
                           size_t *n_pages);
/* cpcache_load_back into the engine's slots: slots[0..n_slots) for the pages
 * cpcache_load_back_plan listed, in order. The pages that load take them (*pages, may be
 * NULL, counts the group's pages loading); the slots of pages that do not (L1 room,
 * min_load_pages) and those the load's evictions freed are the freed slots. [R] */
int cpcache_load_back_slots(cpcache_t c, cpcache_node_t node, const int32_t *slots, size_t n_slots,
                            int64_t *pages, int32_t *freed, size_t freed_cap, size_t *n_freed);
/* cpcache_evict_l1_ex that also hands back this rank's slots freed now (write-back
 * evictions free theirs at the step that commits them: cpcache_take_freed_l1). [R] */
int cpcache_evict_l1_slots(cpcache_t c, int64_t pages, int64_t *freed_pages, int64_t *pending,
                           int32_t *freed, size_t freed_cap, size_t *n_freed);
/* *used = the L1 slots in use on CP rank cp_rank (0..cp_size-1): the pages of it the cache
 * holds. Equal on every rank (the accounting is replicated), so an engine decides from it,
 * identically everywhere, whether every rank's allocator has room for its pages of a
 * sequence (l1_pages - used, when it holds no slots of its own outside the cache) and calls
 * cpcache_evict_l1_slots first when not. A cp_rank outside the group: CPCACHE_ERR_INVALID.
 * [L; replicated value] */
int cpcache_l1_used_by(cpcache_t c, int32_t cp_rank, int64_t *used);
/* Drains this rank's slots the cache let go outside a call that returns them (write-back
 * evictions committed at a step, quarantine, recovery, cpcache_flush) and those an earlier
 * call queued: call after every cpcache_step and cpcache_flush and give them to the
 * allocator. *n_freed is the number queued; the first min(*n_freed, freed_cap) go to freed
 * and leave the queue, the rest stay for the next call. In CPCACHE_L1_CACHE_OWNED mode
 * *n_freed is 0. [L] */
int cpcache_take_freed_l1(cpcache_t c, int32_t *freed, size_t freed_cap, size_t *n_freed);

/* --- token locations (engine-owned L1 indexed by token: SGLang's out_cache_loc) --- */
/* The engine-owned calls above with per-token locations instead of page slots: page slot s
 * holds locations s*page_tokens .. s*page_tokens+page_tokens-1 of this rank's buffers (the
 * token-slot layout of cpcache_l1_buffer); another CP rank's token is -1 in this rank's
 * arrays. A page's locations must start at a multiple of page_tokens and be contiguous,
 * else CPCACHE_ERR_INVALID naming the entry and its value, before any change. Freed-location
 * buffers: *n_freed is the number of locations freed (whole pages); those of the first
 * floor(freed_cap / page_tokens) pages go to freed, the rest stay queued for
 * cpcache_take_freed_locs (nothing is lost; the call succeeds). */

/* cpcache_match_key with the device hit as per-token locations: locs[0 ..
 * out->device_pages*page_tokens) is each token's L1 location on this rank (-1: another CP
 * rank's page). locs_cap must hold n rounded down to whole pages (may be NULL with 0 when n
 * is under a page). l1_slots, when not NULL, gets the device pages' slots as
 * cpcache_match_key's (slots_cap: at least n / page_tokens). [R] */
int cpcache_match_locs(cpcache_t c, const void *key, size_t key_len, const int32_t *tokens, size_t n,
                       cpcache_match_result *out, int64_t *locs, size_t locs_cap, int32_t *l1_slots,
                       size_t slots_cap);
/* cpcache_insert_slots with the request's per-token locations locs[0..n_locs) (n_locs at
 * least n rounded down to whole pages; entries of other ranks' pages and past the whole pages
 * are not read): the cache adopts this rank's whole pages; freed are the locations it does not
 * keep and those the insert's evictions freed. kept (may be NULL; else kept_cap at least n
 * rounded down to whole pages, and n_kept not NULL; it may be locs itself): after the insert,
 * the cache's locations of the sequence's device hit, as cpcache_match_locs gives them, go to
 * kept[0..*n_kept) and out->node is that match's node — SGLang's write of the cache's indices
 * into the request's row, without a second call. [R] */
int cpcache_insert_locs(cpcache_t c, const void *key, size_t key_len, const int32_t *tokens,
                        size_t n, const int64_t *locs, size_t n_locs, cpcache_insert_result *out,
                        int64_t *freed, size_t freed_cap, size_t *n_freed, int64_t *kept,
                        size_t kept_cap, size_t *n_kept);
/* cpcache_load_back_slots into locations: locs[0..n_locs) are page_tokens locations for
 * each page cpcache_load_back_plan lists, in order. [R] */
int cpcache_load_back_locs(cpcache_t c, cpcache_node_t node, const int64_t *locs, size_t n_locs,
                           int64_t *pages, int64_t *freed, size_t freed_cap, size_t *n_freed);
/* cpcache_evict_l1_slots in tokens: evicts up to ceil(tokens / page_tokens) pages; *freed_tokens
 * and *pending_tokens (may be NULL) are the group's pages times page_tokens. [R] */
int cpcache_evict_locs(cpcache_t c, int64_t tokens, int64_t *freed_tokens, int64_t *pending_tokens,
                       int64_t *freed, size_t freed_cap, size_t *n_freed);
/* cpcache_take_freed_l1 in locations. [L] */
int cpcache_take_freed_locs(cpcache_t c, int64_t *freed, size_t freed_cap, size_t *n_freed);
/* The agreed cross-rank eviction that makes room for a request: evicts (least recently used
 * first, as cpcache_evict_l1_slots) until every CP rank r has room for the pages it owns among
 * the sequence's tokens [start, end) (its pages from start / page_tokens up to
 * ceil(end / page_tokens)), beside the pages the cache holds on r (cpcache_l1_used_by) and
 * reserved[r] pages the engine holds outside the cache (reserved: cp_size entries, the same on
 * every rank, or NULL for none). Decided from replicated counts only, so every rank evicts
 * alike. *room is 1 when there is room, 0 when nothing more could be evicted (locked or
 * backing-up pages); freed gets this rank's freed locations either way. [R] */
int cpcache_make_room(cpcache_t c, int64_t start, int64_t end, const int64_t *reserved, int32_t *room,
                      int64_t *freed, size_t freed_cap, size_t *n_freed);

/* Frees up to pages L2 pages of nodes held only in L2; *freed may be NULL. [R] */
int cpcache_evict_l2(cpcache_t c, int64_t pages, int64_t *freed);
/* The consensus step: exactly once per scheduler step, on every rank, even when nothing is
 * pending. One all-reduce on the replica group; every rank applies the agreed result (checks
 * the digests, commits backups, finishes loads) and only then starts the copies chosen since
 * the last step (backups of inserted pages, load-backs). CPCACHE_ERR_DIVERGED: every rank
 * is quarantined at the same step (no hits, no inserts, no slab I/O); keep stepping — at the
 * first step at which every rank is idle the cache resets on every rank, and node handles
 * from before are stale (CPCACHE_ERR_NODE). CPCACHE_ERR_PEER_LOST or _TIMEOUT: the group is
 * unusable; close.
 * Every rank must call it the same number of times, with the same [R] calls between steps.
 * An extra step on one rank meets its peers' next step: CPCACHE_ERR_DIVERGED naming the [R]
 * calls each made since its previous step; a step that peers never join fails at timeout_ms
 * (at once when they close), naming how many steps each rank made. Copies and storage I/O
 * pending longer than CPCACHE_STEP_WARN_MS (default 5000; 0: never) with no step are logged
 * once on stderr and counted (no_step_warnings). [R] */
int cpcache_step(cpcache_t c);
/* Backups, loads and storage operations in flight (equal on every rank: "step while
 * pending" makes the same steps everywhere). [R] */
int cpcache_pending(cpcache_t c, int64_t *pending);
/* Empties the cache when idle (else CPCACHE_ERR_BUSY and nothing changes). [C: the replica group] */
int cpcache_flush(cpcache_t c);

/* --- storage (L3; no-ops without storage_url) --- */

/* Asks storage for the continuation of tokens beyond the tree; *id is 0 when nothing was
 * asked. Step until cpcache_prefetch_pending says 0, then match again. [R] */
int cpcache_prefetch(cpcache_t c, const int32_t *tokens, size_t n, uint64_t *id);
int cpcache_prefetch_key(cpcache_t c, const void *key, size_t key_len, const int32_t *tokens,
                         size_t n, uint64_t *id); /* [R]; see cpcache_match_key */
int cpcache_prefetch_pending(cpcache_t c, uint64_t id, int32_t *pending); /* [R] */
int cpcache_prefetch_revoke(cpcache_t c, uint64_t id);                    /* [R] */

/* --- memory and counters --- */

/* The host address and size of L1 slot `slot` (host L1 only). [L] */
int cpcache_l1_page(cpcache_t c, int32_t slot, void **page, size_t *len);
/* This rank's metrics in Prometheus' text exposition format (cpcache_* series: the counters
 * of cpcache_get_stats and more, labelled rank, replica and slab_group; on a replica's
 * publishing rank the KV event publisher's cpcache_run_kv_event_*), NUL-terminated, into
 * buf[cap] [L]. *len is set to the text's length (without the NUL) on CPCACHE_OK and on
 * CPCACHE_ERR_SIZE (cap < *len + 1: nothing written; retry with a buffer of *len + 1 bytes,
 * or ask with buf NULL and cap 0). */
int cpcache_metrics_text(cpcache_t c, char *buf, size_t cap, size_t *len);
/* Counters; stats->struct_size must be sizeof(cpcache_stats), or the size of an older
 * header's struct (without no_step_warnings), which gets the fields it has. [L] */
int cpcache_get_stats(cpcache_t c, cpcache_stats *stats);

#endif /* CPCACHE_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif
#endif /* CPCACHE_H */
