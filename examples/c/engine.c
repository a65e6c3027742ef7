// engine.c — a small engine loop over libcpcache, for C engines to copy from.
//
// Every rank of the job runs this program (mpirun, cpcache launch, torchrun...). It serves
// a synthetic multi-turn workload — each turn's prompt is the conversation so far plus a
// new question — with a scheduler like `cpcache run`'s: each step decodes one token of
// every running request (a finished one is inserted with its answer, so the next turn hits,
// and unlocked), admits queued requests (match, lock, load the L2 part back, check every
// loaded page, "compute" the missing pages — each CP rank writes the KV of the pages it
// owns — insert), then makes exactly one cpcache_step. KV pages hold content derived from
// their token prefix, page index and TP shard, so every page read back is checked.
//
// Usage: engine [--attn-cp N] [--dp N] [--dp-attention=false] [--clients N] [--rounds N]
//               [--l1-pages N (16)] [--l2-pages N (512)] [--exit-rank R --exit-step S]
//               [--opaque | --layer-first] [--engine-slots] [--device N [--cuda-ipc]]
// DP attention is on by default (cpcache_config_init, as the cpcache commands); --dp-attention is
// accepted and changes nothing, --dp-attention=false turns it off.
// --engine-slots runs the engine-owned flow (l1_mode CPCACHE_L1_ENGINE_OWNED): the engine's own
// per-rank slot allocator gives the slots of the pages this rank owns before "compute", the KV
// is written there, the sequence is inserted with them, and every slot the cache lets go goes
// back to the allocator; load-backs land in slots it allocates. After the final flush every
// slot must be back (slots_out=0), else the exit status is 1.
// --device N lends the per-layer K/V buffers in device memory of CUDA device N instead of host
// memory: the example loads the CUDA driver itself (CPCACHE_CUDA_LIBRARY, else libcuda.so.1,
// as the library does), makes device N's primary context current (the context the library's
// CUDA engine uses, so the pointers it lends are valid there), cuMemAlloc's the buffers and
// lends them as CPCACHE_MEM_DEVICE entries (l1_kind CPCACHE_L1_DEVICE, l1_base NULL) over
// pinned host slabs (pin_host), or CUDA IPC slabs with --cuda-ipc. It writes KV with
// cuMemcpyHtoD, and checks each loaded prefix layer by layer as its layer lands: even layers
// after a stream of its own waited for them (cpcache_wait_l1_layer_on, then a cuMemcpyDtoHAsync
// on that stream), odd layers after cpcache_wait_l1_layer (then cuMemcpyDtoH).
// --exit-rank/--exit-step make rank R exit at step S without closing (a crash, for tests).
// Exit status: 0, 1 when a loaded page held the wrong bytes, 2 on a cpcache or CUDA error (or
// a bad flag), 3 when a peer was lost.
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpcache.h"

#define PAGE_TOKENS 16
#define PAGE_BYTES 4096
#define QUESTION_TOKENS 40
#define ANSWER_TOKENS 24
#define MAX_RUNNING 4
#define MAX_PAGES 256

// check exits with status 2 when a cpcache call failed.
#define check(call)                                                                          \
  do {                                                                                       \
    int rc_ = (call);                                                                        \
    if (rc_ != CPCACHE_OK) {                                                                 \
      fprintf(stderr, "engine: %s: status %d: %s\n", #call, rc_, cpcache_last_error());      \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// prefix_hashes computes a chained hash per whole page of tokens: page i's content is a
// function of every token up to the end of page i, as real KV is.
static void prefix_hashes(const int32_t *tokens, int pages, uint64_t *out) {
  uint64_t h = 0x243f6a8885a308d3ULL;
  for (int p = 0; p < pages; p++) {
    for (int t = 0; t < PAGE_TOKENS; t++) h = mix64(h ^ (uint32_t)tokens[p * PAGE_TOKENS + t]);
    out[p] = h;
  }
}

// kv_fill writes page `index`'s content for this rank's TP shard; kv_check verifies it.
static void kv_fill(uint8_t *page, uint64_t hash, int index, int shard) {
  uint64_t x = mix64(hash ^ mix64((uint64_t)index) ^ ((uint64_t)shard << 48));
  for (int i = 0; i < PAGE_BYTES; i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t v = mix64(x);
    memcpy(page + i, &v, 8);
  }
}

static int kv_check(const uint8_t *page, uint64_t hash, int index, int shard) {
  uint8_t want[PAGE_BYTES];
  kv_fill(want, hash, index, shard);
  return memcmp(page, want, PAGE_BYTES) == 0;
}

// --- the CUDA driver (--device), loaded at run time as the library loads it ---
// The few driver calls the device mode makes, by their ABI (cuda.h's types: CUresult is an
// int, CUdeviceptr a 64-bit integer, contexts and streams opaque pointers).
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
static struct {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDeviceGet)(int *dev, int ordinal);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, int dev);
  CUresult (*cuDevicePrimaryCtxRelease)(int dev);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t n);
  CUresult (*cuMemFree)(CUdeviceptr p);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);
  CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);
  CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream st);
  CUresult (*cuStreamCreate)(CUstream *st, unsigned int flags);
  CUresult (*cuStreamSynchronize)(CUstream st);
  CUresult (*cuStreamDestroy)(CUstream st);
  CUresult (*cuGetErrorName)(CUresult rc, const char **name);
} cu;
// Every symbol the device mode uses (the versioned names are the ones cuda.h maps the calls to),
// resolved at open: a driver that lacks one is refused then, naming it.
static const struct {
  const char *name;
  void **fn;
} cu_symbols[] = {
    {"cuInit", (void **)&cu.cuInit},
    {"cuDeviceGet", (void **)&cu.cuDeviceGet},
    {"cuDevicePrimaryCtxRetain", (void **)&cu.cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease_v2", (void **)&cu.cuDevicePrimaryCtxRelease},
    {"cuCtxSetCurrent", (void **)&cu.cuCtxSetCurrent},
    {"cuCtxSynchronize", (void **)&cu.cuCtxSynchronize},
    {"cuMemAlloc_v2", (void **)&cu.cuMemAlloc},
    {"cuMemFree_v2", (void **)&cu.cuMemFree},
    {"cuMemcpyHtoD_v2", (void **)&cu.cuMemcpyHtoD},
    {"cuMemcpyDtoH_v2", (void **)&cu.cuMemcpyDtoH},
    {"cuMemcpyDtoHAsync_v2", (void **)&cu.cuMemcpyDtoHAsync},
    {"cuStreamCreate", (void **)&cu.cuStreamCreate},
    {"cuStreamSynchronize", (void **)&cu.cuStreamSynchronize},
    {"cuStreamDestroy_v2", (void **)&cu.cuStreamDestroy},
    {"cuGetErrorName", (void **)&cu.cuGetErrorName},
};

static const char *cu_error_name(CUresult rc) {
  const char *name = NULL;
  if (cu.cuGetErrorName(rc, &name) != 0 || name == NULL) name = "an error the driver does not name";
  return name;
}

// cucheck exits with status 2 when a CUDA driver call failed, naming the call and the error.
#define cucheck(call)                                                                        \
  do {                                                                                       \
    CUresult rc_ = (call);                                                                   \
    if (rc_ != 0) {                                                                          \
      fprintf(stderr, "engine: %s: CUDA error %d (%s)\n", #call, rc_, cu_error_name(rc_));   \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

static int device = -1;   // --device: the CUDA device of the L1 buffers; -1: host buffers
static int cu_dev;        // its CUdevice
static CUstream cu_stream; // the stream the even layers' reads wait on (cpcache_wait_l1_layer_on)
static int device_dirty;  // KV written to device memory since the last step

// cuda_open loads the driver, resolves every symbol the device mode uses and makes device
// ordinal's primary context current on this (the only) thread: the library's CUDA engine
// retains the same primary context, so the buffers allocated here are valid in its copies.
static void cuda_open(int ordinal) {
  const char *path = getenv("CPCACHE_CUDA_LIBRARY");
  if (path == NULL || *path == 0) path = "libcuda.so.1";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "engine: --device %d: cannot load the CUDA driver %s: %s\n", ordinal, path, dlerror());
    exit(2);
  }
  for (size_t i = 0; i < sizeof cu_symbols / sizeof cu_symbols[0]; i++) {
    *cu_symbols[i].fn = dlsym(h, cu_symbols[i].name);
    if (*cu_symbols[i].fn == NULL) {
      fprintf(stderr, "engine: --device %d: the CUDA driver %s has no %s\n", ordinal, path, cu_symbols[i].name);
      exit(2);
    }
  }
  CUcontext ctx;
  cucheck(cu.cuInit(0));
  CUresult rc = cu.cuDeviceGet(&cu_dev, ordinal);
  if (rc != 0) {
    fprintf(stderr, "engine: --device %d: cuDeviceGet: CUDA error %d (%s)\n", ordinal, rc, cu_error_name(rc));
    exit(2);
  }
  cucheck(cu.cuDevicePrimaryCtxRetain(&ctx, cu_dev));
  cucheck(cu.cuCtxSetCurrent(ctx));
  cucheck(cu.cuStreamCreate(&cu_stream, 0));
}

typedef struct request {
  int client, round;
  int32_t *tokens; // prompt, then room for the answer
  int prompt_len, answer_len, decoded;
  int pages; // L1 pages reserved while it runs (prompt and answer)
  cpcache_node_t locked;
} request;

typedef struct counters {
  int64_t requests, input_tokens, hit_l1, hit_l2, missed, steps, verified, bad;
  int64_t layer_waits, layer_waits_on; // --device: layers read after each kind of layer wait
} counters;

static cpcache_t cache;
static cpcache_info info;

// The engine's KV memory (default): a small preset-like layout of KV_LAYERS layers, each with
// a K and a V part of KV_ROW bytes a token (all heads), SGLang-style: one buffer per (layer,
// part) indexed by token slot ([l1_pages × PAGE_TOKENS, KV_ROW]), lent to the cache with
// cpcache_config.l1_buffers; 4 × 2 × 32 B × 16 tokens = PAGE_BYTES a page. A page's content
// is laid out page-first (layer 0's K, V, then layer 1's ...) and scattered into the
// buffers, so a chunk that lands in the wrong layer or part fails the check. --opaque uses
// the library's contiguous pool of opaque pages instead (ABI 1's model).
#define KV_LAYERS 4
#define KV_ROW 32
static const char *kv_spec = "layers=4;k=32:sharded;v=32:sharded";
#define CHUNK_BYTES (PAGE_TOKENS * KV_ROW) // one (layer, part) of a page
static int opaque;
static uint8_t *kv_mem[KV_LAYERS][2];  // host buffers
static CUdeviceptr kv_dev[KV_LAYERS][2]; // device buffers (--device)

// chunk_offset is where (layer, part) j sits in a page-first page.
static size_t chunk_offset(int layer, int j) { return (size_t)(layer * 2 + j) * CHUNK_BYTES; }

// page_scatter writes a page-first page into slot's tokens of every (layer, part) buffer;
// page_gather reads them back (host buffers; the device mode reads layer by layer, see
// verify_layers).
static void page_scatter(int32_t slot, const uint8_t *page) {
  for (int l = 0; l < KV_LAYERS; l++)
    for (int j = 0; j < 2; j++) {
      size_t at = (size_t)slot * CHUNK_BYTES;
      if (device >= 0) {
        cucheck(cu.cuMemcpyHtoD(kv_dev[l][j] + at, page + chunk_offset(l, j), CHUNK_BYTES));
        device_dirty = 1;
      } else {
        memcpy(kv_mem[l][j] + at, page + chunk_offset(l, j), CHUNK_BYTES);
      }
    }
}
static void page_gather(int32_t slot, uint8_t *page) {
  for (int l = 0; l < KV_LAYERS; l++)
    for (int j = 0; j < 2; j++) memcpy(page + chunk_offset(l, j), kv_mem[l][j] + (size_t)slot * CHUNK_BYTES, CHUNK_BYTES);
}
static counters cnt;

// --- the engine's own slot allocator (--engine-slots) ---
// A stack of this rank's free L1 slots and which are out; a slot handed back that is not out
// (freed twice, never given) is a bug of the cache or the engine, counted in bad_slots.
static int engine_slots;
static int32_t *slot_free;
static uint8_t *slot_is_out;
static int64_t slot_nfree, slot_bad;

static void slots_init(int64_t n) {
  slot_free = malloc(sizeof(int32_t) * (size_t)n);
  slot_is_out = calloc((size_t)n, 1);
  if (!slot_free || !slot_is_out) {
    fprintf(stderr, "engine: out of memory for the slot allocator\n");
    exit(2);
  }
  for (int64_t s = n - 1; s >= 0; s--) slot_free[slot_nfree++] = (int32_t)s;
}

// slots_take gives n slots; the caller made room first (ensure_room), so running short is
// a bug.
static void slots_take(int n, int32_t *out) {
  if (n > slot_nfree) {
    fprintf(stderr, "engine: rank %d: %d slots wanted, %" PRId64 " free (room was checked)\n", info.rank, n, slot_nfree);
    exit(2);
  }
  for (int i = 0; i < n; i++) {
    out[i] = slot_free[--slot_nfree];
    slot_is_out[out[i]] = 1;
  }
}

static void slots_give_back(const int32_t *slots, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int32_t s = slots[i];
    if (s < 0 || s >= info.l1_pages || !slot_is_out[s]) {
      if (slot_bad++ == 0) fprintf(stderr, "engine: rank %d: slot %d handed back but not out\n", info.rank, s);
      continue;
    }
    slot_is_out[s] = 0;
    slot_free[slot_nfree++] = s;
  }
}

// drain_freed gives the allocator the slots the cache let go outside a call (after every step
// and flush).
static void drain_freed(void) {
  int32_t freed[MAX_PAGES];
  size_t n = 0;
  do {
    check(cpcache_take_freed_l1(cache, freed, MAX_PAGES, &n));
    slots_give_back(freed, n < MAX_PAGES ? n : MAX_PAGES);
  } while (n > MAX_PAGES);
}

// ensure_room evicts until every CP rank's pool has room for its pages among sequence pages
// [lo, hi) (page i is CP rank i mod cp_size's). It decides from cpcache_l1_used_by, which
// is equal on every rank, so every rank evicts the same (a replicated call). 0 when nothing
// more can be evicted (the caller retries at a later step).
static int ensure_room(int64_t lo, int64_t hi) {
  for (;;) {
    int64_t deficit = 0;
    for (int r = 0; r < info.cp_size; r++) {
      int64_t need = 0, used = 0;
      for (int64_t i = lo; i < hi; i++) need += i % info.cp_size == r;
      check(cpcache_l1_used_by(cache, r, &used));
      if (used + need > info.l1_pages) deficit += used + need - info.l1_pages;
    }
    if (deficit == 0) return 1;
    int32_t freed[MAX_PAGES];
    size_t n = 0;
    int64_t pages = 0, pending = 0;
    check(cpcache_evict_l1_slots(cache, deficit, &pages, &pending, freed, MAX_PAGES, &n));
    slots_give_back(freed, n < MAX_PAGES ? n : MAX_PAGES);
    if (n > MAX_PAGES) drain_freed();
    if (pages == 0) return 0;
  }
}

// compute_into writes page `index`'s KV into L1 slot `slot` (the forward pass).
static void compute_into(int32_t slot, uint64_t hash, int index) {
  if (opaque) {
    void *mem;
    size_t len;
    check(cpcache_l1_page(cache, slot, &mem, &len));
    kv_fill(mem, hash, index, info.tp_rank);
  } else {
    uint8_t page[PAGE_BYTES];
    kv_fill(page, hash, index, info.tp_rank);
    page_scatter(slot, page);
  }
}

// insert_engine_slots is insert for --engine-slots: the pages from the leading L1 hit on
// need KV; this rank allocates slots for those it owns, computes into them and inserts with
// them (the hit's own pages keep the slots the match gave). 0 when L1 cannot make room.
static cpcache_node_t insert_engine_slots(const int32_t *tokens, int n) {
  int pages = n / PAGE_TOKENS;
  int32_t hit_slots[MAX_PAGES], own[MAX_PAGES], freed[MAX_PAGES];
  cpcache_match_result m;
  check(cpcache_match(cache, tokens, (size_t)n, &m, hit_slots, MAX_PAGES));
  check(cpcache_lock(cache, m.node)); // the hit's slots stay the cache's while we evict
  int ok = ensure_room(m.device_pages, pages);
  check(cpcache_unlock(cache, m.node));
  if (!ok) return 0;
  uint64_t hashes[MAX_PAGES];
  prefix_hashes(tokens, pages, hashes);
  int nown = 0;
  for (int p = info.cp_rank; p < pages; p += info.cp_size) {
    if (p < m.device_pages) {
      own[nown++] = hit_slots[p];
    } else {
      slots_take(1, &own[nown]);
      compute_into(own[nown++], hashes[p], p);
    }
  }
  cpcache_insert_result res;
  size_t nf = 0;
  int rc = cpcache_insert_slots(cache, NULL, 0, tokens, (size_t)n, own, (size_t)nown, &res, freed, MAX_PAGES, &nf);
  if (rc == CPCACHE_ERR_L1_FULL) { // the caller keeps its slots: the new ones go back
    for (int k = 0, p = info.cp_rank; p < pages; p += info.cp_size, k++)
      if (p >= m.device_pages) slots_give_back(&own[k], 1);
    drain_freed();
    return 0;
  }
  check(rc);
  slots_give_back(freed, nf < MAX_PAGES ? nf : MAX_PAGES);
  if (nf > MAX_PAGES) drain_freed();
  return res.node;
}

// load_back_engine_slots is cpcache_load_back for --engine-slots: room for the hit's host
// pages on every rank, then this rank's destination slots for the pages the plan lists.
static int load_back_engine_slots(const cpcache_match_result *m, int64_t *loading) {
  if (!ensure_room(m->device_pages, m->device_pages + m->host_pages)) return CPCACHE_ERR_L1_FULL;
  int64_t plan[MAX_PAGES];
  size_t np = 0;
  check(cpcache_load_back_plan(cache, m->node, plan, MAX_PAGES, &np));
  int32_t dst[MAX_PAGES], freed[MAX_PAGES];
  slots_take((int)np, dst);
  size_t nf = 0;
  int rc = cpcache_load_back_slots(cache, m->node, dst, np, loading, freed, MAX_PAGES, &nf);
  if (rc != CPCACHE_OK) {
    slots_give_back(dst, np); // on an error the caller keeps its slots
    drain_freed();
    return rc;
  }
  slots_give_back(freed, nf < MAX_PAGES ? nf : MAX_PAGES);
  if (nf > MAX_PAGES) drain_freed();
  return CPCACHE_OK;
}

// conversation_tokens returns client's tokens up to and including round's question
// (answer = 0) or answer (answer = 1); deterministic, so every rank builds the same.
static int conversation_tokens(int client, int round, int answer, int32_t *out) {
  int n = 0;
  for (int r = 0; r <= round; r++) {
    for (int t = 0; t < QUESTION_TOKENS; t++) out[n++] = (int32_t)(mix64((uint64_t)client << 32 | r << 16 | t) % 32000);
    if (r < round || answer)
      for (int t = 0; t < ANSWER_TOKENS; t++) out[n++] = (int32_t)(mix64((uint64_t)client << 32 | r << 16 | (t + 1000)) % 32000);
  }
  return n;
}

// verify checks the L1 content of the device pages of tokens this rank owns.
static void verify(const int32_t *tokens, int pages, const int32_t *slots) {
  uint64_t hashes[MAX_PAGES];
  prefix_hashes(tokens, pages, hashes);
  for (int p = 0; p < pages; p++) {
    if (p % info.cp_size != info.cp_rank) continue;
    void *mem;
    size_t len;
    uint8_t page[PAGE_BYTES];
    if (opaque) {
      check(cpcache_l1_page(cache, slots[p], &mem, &len));
    } else {
      page_gather(slots[p], page);
      mem = page;
    }
    cnt.verified++;
    if (!kv_check(mem, hashes[p], p, info.tp_rank)) {
      if (cnt.bad++ == 0) fprintf(stderr, "engine: rank %d: page %d (slot %d) holds the wrong bytes\n", info.rank, p, slots[p]);
    }
  }
}

// verify_layers is verify for device buffers, layer by layer. When the prefix was loaded back
// (loaded), a layer is read only once its wait returned: even layers through cu_stream, after
// cpcache_wait_l1_layer_on made that stream wait for the layer (the reads are enqueued behind
// the wait, as the layer's attention kernel would be), odd layers after cpcache_wait_l1_layer.
// Each layer's K and V chunks of every page this rank owns are checked against the page's
// content; a page counts as bad once, whichever layer or part is wrong.
static void verify_layers(const int32_t *tokens, cpcache_node_t node, int pages, const int32_t *slots, int loaded) {
  static uint8_t got[MAX_PAGES][2][CHUNK_BYTES];
  uint64_t hashes[MAX_PAGES];
  uint8_t bad[MAX_PAGES] = {0};
  prefix_hashes(tokens, pages, hashes);
  for (int l = 0; l < KV_LAYERS; l++) {
    int on_stream = l % 2 == 0;
    if (loaded && on_stream) {
      check(cpcache_wait_l1_layer_on(cache, node, l, cu_stream));
      cnt.layer_waits_on++;
    } else if (loaded) {
      check(cpcache_wait_l1_layer(cache, node, l, -1));
      cnt.layer_waits++;
    }
    for (int p = info.cp_rank; p < pages; p += info.cp_size)
      for (int j = 0; j < 2; j++) {
        CUdeviceptr src = kv_dev[l][j] + (size_t)slots[p] * CHUNK_BYTES;
        if (on_stream) cucheck(cu.cuMemcpyDtoHAsync(got[p][j], src, CHUNK_BYTES, cu_stream));
        else cucheck(cu.cuMemcpyDtoH(got[p][j], src, CHUNK_BYTES));
      }
    if (on_stream) cucheck(cu.cuStreamSynchronize(cu_stream));
    for (int p = info.cp_rank; p < pages; p += info.cp_size) {
      uint8_t want[PAGE_BYTES];
      kv_fill(want, hashes[p], p, info.tp_rank);
      for (int j = 0; j < 2; j++) {
        if (bad[p] || memcmp(got[p][j], want + chunk_offset(l, j), CHUNK_BYTES) == 0) continue;
        bad[p] = 1;
        if (cnt.bad++ == 0)
          fprintf(stderr, "engine: rank %d: page %d (slot %d) layer %d part %d holds the wrong bytes\n", info.rank, p, slots[p], l, j);
      }
    }
  }
  for (int p = info.cp_rank; p < pages; p += info.cp_size) cnt.verified++;
}

// insert caches tokens' whole pages and writes the KV of the new pages this rank owns; it
// returns the node to lock, or 0 when L1 is full (nothing cached).
static cpcache_node_t insert(const int32_t *tokens, int n) {
  if (engine_slots) return insert_engine_slots(tokens, n);
  cpcache_fill_page fill[MAX_PAGES];
  cpcache_insert_result res;
  int rc = cpcache_insert(cache, tokens, (size_t)n, &res, fill, MAX_PAGES);
  if (rc == CPCACHE_ERR_L1_FULL) return 0;
  check(rc);
  uint64_t hashes[MAX_PAGES];
  prefix_hashes(tokens, n / PAGE_TOKENS, hashes);
  for (int64_t i = 0; i < res.n_fill; i++) {
    if (!fill[i].owned) continue;
    if (opaque) {
      void *mem;
      size_t len;
      check(cpcache_l1_page(cache, fill[i].slot, &mem, &len));
      kv_fill(mem, hashes[fill[i].index], (int)fill[i].index, info.tp_rank);
    } else {
      uint8_t page[PAGE_BYTES];
      kv_fill(page, hashes[fill[i].index], (int)fill[i].index, info.tp_rank);
      page_scatter(fill[i].slot, page);
    }
  }
  return res.node;
}

// step makes the one consensus step of a scheduler step; a lost peer ends this rank.
static void step(void) {
  // The KV written to device memory must be there before the step that starts its backups:
  // cuMemcpyHtoD from pageable memory may return before its DMA lands, and the library's
  // copies run on streams of its own that do not wait for the legacy stream.
  if (device_dirty) {
    cucheck(cu.cuCtxSynchronize());
    device_dirty = 0;
  }
  int rc = cpcache_step(cache); // exactly once per scheduler step, on every rank
  if (rc == CPCACHE_ERR_PEER_LOST) {
    fprintf(stderr, "engine: rank %d: peer lost at step %" PRId64 ": %s\n", info.rank, cnt.steps, cpcache_last_error());
    cpcache_close(cache);
    exit(3);
  }
  check(rc);
  cnt.steps++;
  if (engine_slots) drain_freed();
}

// prefill admits r: match, lock, load back, check, compute the rest, insert.
static int prefill(request *r) {
  int32_t slots[MAX_PAGES];
  cpcache_match_result m, after;
  check(cpcache_match(cache, r->tokens, (size_t)r->prompt_len, &m, slots, MAX_PAGES));
  check(cpcache_lock(cache, m.node));
  after = m;
  int read_while_loading = 0; // device: the prefix was checked layer by layer as it loaded
  if (m.host_pages > 0) {
    int64_t loading = 0;
    int rc = engine_slots ? load_back_engine_slots(&m, &loading) : cpcache_load_back(cache, m.node, &loading);
    if (rc == CPCACHE_ERR_L1_FULL) { // L1 full for now: retry at a later step
      check(cpcache_unlock(cache, m.node));
      return 0;
    }
    check(rc);
    if (device >= 0 && loading > 0) {
      // A device engine overlaps the load with its prefill: after the step that starts the
      // copies, each layer is read as soon as it has landed (verify_layers waits for it) while
      // the later layers still copy; the group's agreement below then confirms the hit.
      // (loading is the group's count, equal on every rank: every rank takes this step.)
      step();
      cpcache_match_result during;
      check(cpcache_match(cache, r->tokens, (size_t)r->prompt_len, &during, slots, MAX_PAGES));
      verify_layers(r->tokens, during.node, (int)during.device_pages, slots, 1);
      read_while_loading = 1;
    }
    // The copies start at the next step; wait until the group agrees they are over (a copy
    // that failed on any rank then leaves the same shorter hit everywhere), match again,
    // and wait for this rank's own copies before reading the pages.
    for (int32_t pending = 1;;) {
      check(cpcache_load_pending(cache, m.node, &pending));
      if (!pending) break;
      step();
    }
    check(cpcache_match(cache, r->tokens, (size_t)r->prompt_len, &after, slots, MAX_PAGES));
    if (device < 0) check(cpcache_wait_l1(cache, after.node, -1)); // device: layer by layer
  }
  if (device < 0) verify(r->tokens, (int)after.device_pages, slots);
  else if (!read_while_loading) verify_layers(r->tokens, after.node, (int)after.device_pages, slots, m.host_pages > 0);
  cpcache_node_t node = insert(r->tokens, r->prompt_len);
  if (node == 0) { // L1 full for now: retry at a later step
    check(cpcache_unlock(cache, m.node));
    return 0;
  }
  check(cpcache_lock(cache, node));
  check(cpcache_unlock(cache, m.node));
  r->locked = node;
  int64_t l1 = m.device_pages * PAGE_TOKENS, l2 = (after.device_pages - m.device_pages) * PAGE_TOKENS;
  cnt.requests++;
  cnt.input_tokens += r->prompt_len;
  cnt.hit_l1 += l1;
  cnt.hit_l2 += l2;
  cnt.missed += r->prompt_len - l1 - l2;
  return 1;
}

// finish inserts the prompt with its answer (the next turn's history) and unlocks it.
static void finish(request *r) {
  int n = conversation_tokens(r->client, r->round, 1, r->tokens);
  insert(r->tokens, n); // best effort: a full L1 only loses the answer's pages
  check(cpcache_unlock(cache, r->locked));
}

// arg is the value of flag name, an integer in lo..hi, or def without the flag. A value that
// is not such an integer (or a flag without a value) ends the process with status 2 and a
// message naming it, before any rank talks to another.
static long arg(int argc, char **argv, const char *name, long def, long lo, long hi) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], name) != 0) continue;
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == 0 || *end != 0 || errno == ERANGE || x < lo || x > hi) {
      fprintf(stderr, "engine: %s \"%s\": want an integer in %ld..%ld\n", name, v, lo, hi);
      exit(2);
    }
    return x;
  }
  return def;
}

static int flag(int argc, char **argv, const char *name) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], name) == 0) return 1;
  return 0;
}

int main(int argc, char **argv) {
  // Gloo writes to sockets without MSG_NOSIGNAL: a SIGPIPE on one of this process's own
  // threads would otherwise kill it when a peer dies (see cmd/libcpcache/doc.go, Signals).
  signal(SIGPIPE, SIG_IGN);
  long exit_rank = arg(argc, argv, "--exit-rank", -1, -1, INT32_MAX);
  long exit_step = arg(argc, argv, "--exit-step", -1, -1, INT32_MAX);
  cpcache_config cfg;
  check(cpcache_config_init(&cfg));
  cfg.attn_cp = (int32_t)arg(argc, argv, "--attn-cp", 1, 1, INT32_MAX);
  cfg.dp = (int32_t)arg(argc, argv, "--dp", 1, 1, INT32_MAX);
  if (flag(argc, argv, "--dp-attention=false")) cfg.dp_attention = 0;
  cfg.page_tokens = PAGE_TOKENS;
  cfg.page_bytes = PAGE_BYTES;
  // A small L1 by default (16 pages per rank: the workload's later turns outgrow it), so that
  // the run shows both tiers: prefixes still in L1, and prefixes evicted from L1 and loaded
  // back from the CP group's shared L2, every loaded page checked.
  cfg.l1_pages = arg(argc, argv, "--l1-pages", 16, 1, INT32_MAX);
  cfg.l2_pages = arg(argc, argv, "--l2-pages", 512, 1, INT32_MAX);
  int clients = (int)arg(argc, argv, "--clients", 16, 1, 1 << 16), rounds = (int)arg(argc, argv, "--rounds", 4, 1, 1 << 10);
  opaque = flag(argc, argv, "--opaque");
  engine_slots = flag(argc, argv, "--engine-slots");
  device = (int)arg(argc, argv, "--device", -1, 0, INT32_MAX);
  int cuda_ipc = flag(argc, argv, "--cuda-ipc");
  if (cuda_ipc && device < 0) {
    fprintf(stderr, "engine: --cuda-ipc needs --device N (CUDA IPC slabs serve a device L1)\n");
    return 2;
  }
  if (opaque && device >= 0) {
    fprintf(stderr, "engine: --opaque with --device %d: the device mode lends per-layer K/V buffers, not the pool\n", device);
    return 2;
  }
  if (device >= 0) {
    cuda_open(device);
    cfg.l1_kind = CPCACHE_L1_DEVICE, cfg.l1_base = NULL, cfg.device = device;
    if (cuda_ipc) cfg.slab_backend = CPCACHE_SLAB_CUDA_IPC;
    else cfg.pin_host = 1; // a device L1 with host slabs copies through their pinned mappings
  }
  if (engine_slots) cfg.l1_mode = CPCACHE_L1_ENGINE_OWNED;
  cpcache_l1_buffer bufs[KV_LAYERS * 2];
  if (!opaque) {
    cfg.kv_layout = kv_spec;
    // page_bytes stays PAGE_BYTES: with the launcher's world the library cannot derive it before
    // open; it checks it against the layout (attention-TP 1 here) at open.
    cfg.l2_layout = flag(argc, argv, "--layer-first") ? CPCACHE_L2_LAYER_FIRST : CPCACHE_L2_PAGE_FIRST;
    for (int l = 0; l < KV_LAYERS; l++)
      for (int j = 0; j < 2; j++) {
        if (device >= 0) { // the device pointer travels as a void * the library never dereferences
          cucheck(cu.cuMemAlloc(&kv_dev[l][j], (size_t)cfg.l1_pages * CHUNK_BYTES));
          bufs[l * 2 + j] = cpcache_l1_token_slot_buffer(l, j, CPCACHE_MEM_DEVICE, (void *)(uintptr_t)kv_dev[l][j], cfg.l1_pages, PAGE_TOKENS, KV_ROW);
          continue;
        }
        kv_mem[l][j] = calloc((size_t)cfg.l1_pages * PAGE_TOKENS, KV_ROW);
        if (!kv_mem[l][j]) {
          fprintf(stderr, "engine: out of memory for the L1 buffers\n");
          return 2;
        }
        bufs[l * 2 + j] = cpcache_l1_token_slot_buffer(l, j, CPCACHE_MEM_HOST, kv_mem[l][j], cfg.l1_pages, PAGE_TOKENS, KV_ROW);
      }
    cfg.l1_buffers = bufs, cfg.l1_num_buffers = KV_LAYERS * 2;
  }
  check(cpcache_open(&cfg, &cache)); // rank and world from the launcher's environment
  info.struct_size = sizeof info;
  check(cpcache_get_info(cache, &info));
  if (engine_slots) slots_init(info.l1_pages);
  if (!opaque) {
    int64_t page_bytes = 0;
    check(cpcache_kv_page_bytes(cache, &page_bytes));
    if (page_bytes != PAGE_BYTES) {
      fprintf(stderr, "engine: the KV layout takes %" PRId64 " bytes a page, want %d (attention-TP 1)\n", page_bytes, PAGE_BYTES);
      return 2;
    }
  }

  // This replica's requests: clients with client mod dp == dp_rank, round by round.
  int dp = info.world / info.replica_size, nreq = 0, next = 0, nrun = 0, reserved = 0;
  request *reqs = calloc((size_t)(clients * rounds), sizeof(request));
  request *running[MAX_RUNNING];
  int *done_round = calloc((size_t)clients, sizeof(int)); // rounds finished per client
  for (int r = 0; r < rounds; r++)
    for (int c = info.dp_rank; c < clients; c += dp) {
      request *q = &reqs[nreq++];
      q->client = c, q->round = r;
      q->tokens = malloc(sizeof(int32_t) * (size_t)(rounds * (QUESTION_TOKENS + ANSWER_TOKENS)));
      q->prompt_len = conversation_tokens(c, r, 0, q->tokens);
      q->answer_len = ANSWER_TOKENS;
      q->pages = (q->prompt_len + q->answer_len + PAGE_TOKENS - 1) / PAGE_TOKENS;
    }

  int finished = 0;
  while (finished < nreq) {
    // Decode one token of every running request; finish complete ones.
    for (int i = 0; i < nrun;) {
      request *r = running[i];
      if (++r->decoded < r->answer_len) {
        i++;
        continue;
      }
      finish(r);
      reserved -= r->pages;
      done_round[r->client]++;
      finished++;
      running[i] = running[--nrun];
    }
    // Admit in order while L1 has room for the running requests' pages; a turn waits for
    // its conversation's previous one. Every condition is replicated state.
    while (next < nreq && nrun < MAX_RUNNING && done_round[reqs[next].client] == reqs[next].round &&
           (nrun == 0 || reserved + reqs[next].pages <= info.l1_pages)) {
      if (!prefill(&reqs[next])) break;
      reserved += reqs[next].pages;
      running[nrun++] = &reqs[next++];
    }
    if (info.rank == exit_rank && cnt.steps >= exit_step) _exit(0); // a crash: no close
    step();
  }
  for (int64_t pending = 1; pending > 0;) {
    check(cpcache_pending(cache, &pending));
    step();
  }
  int64_t slots_out = 0;
  if (engine_slots) { // the final flush lets every slot go: all must be back
    check(cpcache_flush(cache));
    drain_freed();
    slots_out = info.l1_pages - slot_nfree;
  }

  cpcache_stats st;
  st.struct_size = sizeof st;
  check(cpcache_get_stats(cache, &st));
  double hit = cnt.input_tokens ? (double)(cnt.hit_l1 + cnt.hit_l2) / (double)cnt.input_tokens : 0;
  printf("rank %d/%d (cp %d/%d, dp %d, consensus %s): requests=%" PRId64 " input_tokens=%" PRId64
         " tokens_hit_l1=%" PRId64 " tokens_hit_l2=%" PRId64 " tokens_missed=%" PRId64 " hit_rate=%.3f"
         " pages_written_l2=%" PRId64 " pages_loaded_l2=%" PRId64 " scheduler_steps=%" PRId64
         " consensus_steps=%" PRId64 " collectives_per_step=%.3f digest_checks=%" PRId64
         " digest_mismatches=%" PRId64 " pages_verified=%" PRId64 " bad_pages=%" PRId64,
         info.rank, info.world, info.cp_rank, info.cp_size, info.dp_rank, info.consensus, cnt.requests,
         cnt.input_tokens, cnt.hit_l1, cnt.hit_l2, cnt.missed, hit, st.pages_written_l2, st.pages_loaded_l2,
         cnt.steps, st.steps, cnt.steps ? (double)st.steps / (double)cnt.steps : 0, st.digest_checks,
         st.digest_mismatches, cnt.verified, cnt.bad);
  if (engine_slots) printf(" slots_out=%" PRId64 " bad_slots=%" PRId64, slots_out, slot_bad);
  if (device >= 0)
    printf(" l1=device%d slabs=%s layer_waits=%" PRId64 " layer_waits_on=%" PRId64, device, cuda_ipc ? "cuda-ipc" : "pinned-host",
           cnt.layer_waits, cnt.layer_waits_on);
  printf("\n");
  if (info.cp_rank == 0 && info.tp_rank == 0) // what the run showed, once per replica
    printf("engine: replica %d (CP%d): %" PRId64 " requests, %" PRId64 " prompt tokens: %" PRId64 " found in L1, %" PRId64
           " loaded back from the group's shared L2 (this rank's pages checked: %" PRId64 ", wrong: %" PRId64 "), %" PRId64
           " computed; %.3f consensus steps per scheduler step\n",
           info.dp_rank, info.cp_size, cnt.requests, cnt.input_tokens, cnt.hit_l1, cnt.hit_l2, cnt.verified, cnt.bad,
           cnt.missed, cnt.steps ? (double)st.steps / (double)cnt.steps : 0);
  check(cpcache_close(cache));
  if (device >= 0) { // after the close: the cache's copies are over
    for (int l = 0; l < KV_LAYERS; l++)
      for (int j = 0; j < 2; j++) cucheck(cu.cuMemFree(kv_dev[l][j]));
    cucheck(cu.cuStreamDestroy(cu_stream));
    cucheck(cu.cuDevicePrimaryCtxRelease(cu_dev));
  }
  for (int i = 0; i < nreq; i++) free(reqs[i].tokens);
  free(reqs);
  free(done_round);
  if (cnt.bad > 0 || st.digest_mismatches > 0 || st.steps != cnt.steps || slots_out != 0 || slot_bad != 0) return 1;
  return 0;
}
