// bad_calls.c — every bad call of include/cpcache.h returns its error code (with a
// message) and changes nothing; nothing crashes. One process, a world of one rank.
// Also: the last error is per thread, and the engine's own SIGINT handler keeps working
// with the Go runtime loaded (see "Signals" in cmd/libcpcache/doc.go).
//
// Usage: bad_calls (exit 0 when every check passed; each failed check is printed).
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpcache.h"

static int failures;

#define expect(call, want)                                                                      \
  do {                                                                                          \
    int got_ = (call);                                                                          \
    if (got_ != (want)) {                                                                       \
      fprintf(stderr, "FAIL %s:%d: %s = %d, want %s (%d); last error: %s\n", __FILE__, __LINE__, \
              #call, got_, #want, (want), cpcache_last_error());                               \
      failures++;                                                                               \
    } else if ((want) != CPCACHE_OK && cpcache_last_error()[0] == 0) {                          \
      fprintf(stderr, "FAIL %s:%d: %s gave no message\n", __FILE__, __LINE__, #call);            \
      failures++;                                                                               \
    }                                                                                           \
  } while (0)

#define expect_true(cond)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);             \
      failures++;                                                                \
    }                                                                            \
  } while (0)

enum { PAGE_TOKENS = 4, PAGE_BYTES = 64, L1_PAGES = 16 };

static char store[256];

static void base_config(cpcache_config *cfg) {
  expect(cpcache_config_init(cfg), CPCACHE_OK);
  cfg->world = 1;
  cfg->rank = 0;
  cfg->store_url = store;
  cfg->page_tokens = PAGE_TOKENS;
  cfg->page_bytes = PAGE_BYTES;
  cfg->l1_pages = L1_PAGES;
  cfg->l2_pages = 32;
}

// Store callbacks that are never called (the configs that use them are refused first).
static int no_set(void *ctx, const char *k, size_t kl, const void *v, size_t vl, char *e, size_t el) {
  (void)ctx, (void)k, (void)kl, (void)v, (void)vl, (void)e, (void)el;
  return CPCACHE_STORE_ERROR;
}
static int no_get(void *ctx, const char *k, size_t kl, int64_t ms, void *b, size_t cap, size_t *len, char *e, size_t el) {
  (void)ctx, (void)k, (void)kl, (void)ms, (void)b, (void)cap, (void)len, (void)e, (void)el;
  return CPCACHE_STORE_ERROR;
}
static int no_add(void *ctx, const char *k, size_t kl, int64_t d, int64_t *out, char *e, size_t el) {
  (void)ctx, (void)k, (void)kl, (void)d, (void)out, (void)e, (void)el;
  return CPCACHE_STORE_ERROR;
}
static int no_del(void *ctx, const char *k, size_t kl, char *e, size_t el) {
  (void)ctx, (void)k, (void)kl, (void)e, (void)el;
  return CPCACHE_STORE_ERROR;
}

// An in-memory store of callbacks (cpcache_store), as an engine's own key-value service: a
// mutex-guarded table of keys; every key any callback saw is counted by prefix.
#define MEM_KEYS 4096
static struct {
  pthread_mutex_t mu;
  char *key[MEM_KEYS];
  unsigned char *val[MEM_KEYS];
  size_t len[MEM_KEYS];
  int n, calls, foreign; // foreign: calls on a key outside "cpcache/"
} mem = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int mem_find(const char *k) { // mem.mu held
  for (int i = 0; i < mem.n; i++)
    if (mem.key[i] && strcmp(mem.key[i], k) == 0) return i;
  return -1;
}
static void mem_note(const char *k) { // mem.mu held
  mem.calls++;
  if (strncmp(k, "cpcache/", 8) != 0) mem.foreign++;
}
static int mem_put(const char *k, const void *v, size_t vl) { // mem.mu held
  int i = mem_find(k);
  if (i < 0) {
    if (mem.n == MEM_KEYS) return -1;
    i = mem.n++;
    mem.key[i] = strdup(k);
  } else {
    free(mem.val[i]);
  }
  mem.val[i] = malloc(vl ? vl : 1);
  memcpy(mem.val[i], v, vl);
  mem.len[i] = vl;
  return 0;
}
static int mem_set(void *ctx, const char *k, size_t kl, const void *v, size_t vl, char *e, size_t el) {
  (void)ctx, (void)kl;
  pthread_mutex_lock(&mem.mu);
  mem_note(k);
  int rc = mem_put(k, v, vl);
  pthread_mutex_unlock(&mem.mu);
  if (rc) snprintf(e, el, "store full");
  return rc ? CPCACHE_STORE_ERROR : CPCACHE_STORE_OK;
}
static int mem_get(void *ctx, const char *k, size_t kl, int64_t ms, void *b, size_t cap, size_t *len, char *e, size_t el) {
  (void)ctx, (void)kl, (void)e, (void)el;
  for (int64_t waited = 0;; waited++) {
    pthread_mutex_lock(&mem.mu);
    mem_note(k);
    int i = mem_find(k);
    if (i >= 0) {
      *len = mem.len[i];
      if (mem.len[i] <= cap) memcpy(b, mem.val[i], mem.len[i]);
    }
    pthread_mutex_unlock(&mem.mu);
    if (i >= 0) return CPCACHE_STORE_OK;
    if (waited >= ms) return CPCACHE_STORE_ABSENT;
    usleep(1000);
  }
}
static int mem_add(void *ctx, const char *k, size_t kl, int64_t d, int64_t *out, char *e, size_t el) {
  (void)ctx, (void)kl;
  char buf[32];
  pthread_mutex_lock(&mem.mu);
  mem_note(k);
  int i = mem_find(k);
  long long n = 0;
  if (i >= 0) {
    snprintf(buf, sizeof buf, "%.*s", (int)(mem.len[i] < 31 ? mem.len[i] : 31), (const char *)mem.val[i]);
    n = atoll(buf);
  }
  n += d;
  snprintf(buf, sizeof buf, "%lld", n);
  int rc = mem_put(k, buf, strlen(buf));
  pthread_mutex_unlock(&mem.mu);
  if (rc) snprintf(e, el, "store full");
  *out = n;
  return rc ? CPCACHE_STORE_ERROR : CPCACHE_STORE_OK;
}
static int mem_del(void *ctx, const char *k, size_t kl, char *e, size_t el) {
  (void)ctx, (void)kl, (void)e, (void)el;
  pthread_mutex_lock(&mem.mu);
  mem_note(k);
  int i = mem_find(k);
  if (i >= 0) {
    free(mem.key[i]);
    free(mem.val[i]);
    mem.key[i] = NULL;
    mem.val[i] = NULL;
  }
  pthread_mutex_unlock(&mem.mu);
  return CPCACHE_STORE_OK;
}

static void *other_thread(void *arg) {
  (void)arg;
  expect(cpcache_match(0, NULL, 0, NULL, NULL, 0), CPCACHE_ERR_CLOSED);
  expect_true(strstr(cpcache_last_error(), "not open") != NULL);
  return NULL;
}

static volatile sig_atomic_t got_sigint;
static void on_sigint(int sig) { (void)sig; got_sigint = 1; }

int main(void) {
  char dir[] = "/tmp/cpcache-badcalls-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  snprintf(store, sizeof store, "file://%s", dir);

  // The library and the header agree.
  expect_true(cpcache_abi_version() == CPCACHE_ABI_VERSION);
  expect_true(strncmp(cpcache_version(), "cpcache ", 8) == 0);
#ifdef CPCACHE_EXPECTED_VERSION /* the Makefile's: "cpcache " and the VERSION file */
  if (strcmp(cpcache_version(), CPCACHE_EXPECTED_VERSION) != 0) {
    fprintf(stderr, "cpcache_version() = \"%s\", want \"%s\"\n", cpcache_version(), CPCACHE_EXPECTED_VERSION);
    failures++;
  }
#endif
  expect_true(cpcache_last_error() != NULL);

  // NULL pointers and wrong struct sizes.
  cpcache_config cfg;
  cpcache_t c = 0;
  expect(cpcache_config_init(NULL), CPCACHE_ERR_INVALID);
  base_config(&cfg);
  // cpcache_config_init's defaults: DP attention on (as every cpcache command), the launcher's
  // rank (-1), a minute per collective, 16-token pages, host slabs and a library-allocated L1.
  cpcache_config defaults;
  memset(&defaults, 0xff, sizeof defaults);
  expect(cpcache_config_init(&defaults), CPCACHE_OK);
  expect_true(defaults.dp_attention == 1);
  expect_true(defaults.rank == -1 && defaults.world == 0 && defaults.timeout_ms == 60000 && defaults.page_tokens == 16);
  expect_true(defaults.slab_backend == CPCACHE_SLAB_HOST && defaults.l1_kind == CPCACHE_L1_ALLOC && defaults.store_url == NULL);
  expect(cpcache_open(NULL, &c), CPCACHE_ERR_INVALID);
  expect(cpcache_open(&cfg, NULL), CPCACHE_ERR_INVALID);
  cfg.struct_size = sizeof cfg - 8;
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_SIZE);
  base_config(&cfg);
  cfg.abi_version = CPCACHE_ABI_VERSION + 1;
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_SIZE);

  // Bad configuration values, rejected before any rendezvous.
  base_config(&cfg);
  cfg.page_bytes = 0;
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
  expect_true(strstr(cpcache_last_error(), "page_bytes 0") != NULL);
  base_config(&cfg);
  cfg.l1_kind = CPCACHE_L1_HOST; // without l1_base
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
  base_config(&cfg);
  cfg.rank = 3; // outside a world of 1
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
  base_config(&cfg);
  cfg.l1_kind = 7;
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
  // Timeouts out of range, named as given: a negative one whose milliseconds overflow a
  // time.Duration must not wrap around to a positive deadline of centuries, and INT64_MAX
  // must not be reported as -1.
  const int64_t bad_timeouts[] = {0, -1, INT64_MIN / 1000, INT64_MIN, INT64_MAX};
  for (size_t i = 0; i < sizeof bad_timeouts / sizeof bad_timeouts[0]; i++) {
    char want[64];
    base_config(&cfg);
    cfg.timeout_ms = bad_timeouts[i];
    snprintf(want, sizeof want, "timeout_ms %lld ", (long long)bad_timeouts[i]);
    expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), want) != NULL);
  }
  // Pools larger than the host's memory: refused, not allocated (the kernel would kill us).
  base_config(&cfg);
  cfg.l2_pages = INT32_MAX;
  cfg.page_bytes = (int64_t)1 << 30;
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
  expect_true(strstr(cpcache_last_error(), "of host memory") != NULL);
  // An unknown consensus backend is the configuration's error, not an I/O error.
  base_config(&cfg);
  cfg.consensus = "carrier-pigeon";
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
  expect_true(strstr(cpcache_last_error(), "carrier-pigeon") != NULL);
  // KV event endpoints and the metrics address: refused naming the field and the value.
  {
    const struct {
      const char *endpoint, *replay, *metrics, *want;
    } bad_events[] = {
        {"tcp://*:99999", NULL, NULL, "kv_events_endpoint \"tcp://*:99999\""},
        {"bogus://x", NULL, NULL, "kv_events_endpoint \"bogus://x\""},
        {"tcp://127.0.0.1:5557", "tcp://host:5558", NULL, "kv_events_replay_endpoint \"tcp://host:5558\""},
        {NULL, "tcp://*:5558", NULL, "kv_events_replay_endpoint \"tcp://*:5558\""},
        {NULL, NULL, "nowhere", "metrics_addr \"nowhere\""},
    };
    for (size_t i = 0; i < sizeof bad_events / sizeof bad_events[0]; i++) {
      base_config(&cfg);
      cfg.kv_events_endpoint = bad_events[i].endpoint;
      cfg.kv_events_replay_endpoint = bad_events[i].replay;
      cfg.metrics_addr = bad_events[i].metrics;
      expect(cpcache_open(&cfg, &c), CPCACHE_ERR_INVALID);
      expect_true(strstr(cpcache_last_error(), bad_events[i].want) != NULL);
      expect_true(c == 0);
    }
  }
  base_config(&cfg);
  cfg.attn_cp = 2; // does not divide a world of 1
  expect(cpcache_open(&cfg, &c), CPCACHE_ERR_CONFIG);
  expect_true(c == 0);

  // Calls on handles that were never opened.
  cpcache_stats st = {.struct_size = sizeof st};
  expect(cpcache_step(0), CPCACHE_ERR_CLOSED);
  expect(cpcache_step(12345), CPCACHE_ERR_CLOSED);
  expect(cpcache_get_stats(99, &st), CPCACHE_ERR_CLOSED);
  expect(cpcache_close(0), CPCACHE_ERR_CLOSED);
  expect(cpcache_abort(0), CPCACHE_OK); // no open in flight: nothing to cancel
  expect(cpcache_abort(12345), CPCACHE_ERR_CLOSED);

  // Open; a second open in this process fails.
  base_config(&cfg);
  expect(cpcache_open(&cfg, &c), CPCACHE_OK);
  cpcache_t c2 = 0;
  expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_ALREADY_OPEN);
  expect_true(c2 == 0);

  cpcache_info info = {.struct_size = sizeof info};
  expect(cpcache_get_info(c, &info), CPCACHE_OK);
  expect_true(info.world == 1 && info.cp_size == 1 && info.page_bytes == PAGE_BYTES && info.l1_base != NULL);
  cpcache_info short_info = {.struct_size = 4};
  expect(cpcache_get_info(c, &short_info), CPCACHE_ERR_SIZE);
  expect(cpcache_get_info(c, NULL), CPCACHE_ERR_INVALID);
  cpcache_stats short_stats = {.struct_size = sizeof short_stats + 8};
  expect(cpcache_get_stats(c, &short_stats), CPCACHE_ERR_SIZE);
  expect(cpcache_get_stats(c, NULL), CPCACHE_ERR_INVALID);

  // cpcache_metrics_text: the length asked with no buffer, a short buffer refused with the
  // full length, then the text (NUL-terminated) with the cache's series.
  {
    size_t need = 0, len = 0;
    expect(cpcache_metrics_text(c, NULL, 0, NULL), CPCACHE_ERR_INVALID);
    expect(cpcache_metrics_text(c, NULL, 16, &need), CPCACHE_ERR_INVALID);
    expect(cpcache_metrics_text(c, NULL, 0, &need), CPCACHE_ERR_SIZE);
    expect_true(need > 100);
    char *text = malloc(need + 1);
    expect_true(text != NULL);
    memset(text, 'x', need + 1);
    expect(cpcache_metrics_text(c, text, need, &len), CPCACHE_ERR_SIZE); // no room for the NUL
    expect_true(len == need && text[0] == 'x');
    expect(cpcache_metrics_text(c, text, need + 1, &len), CPCACHE_OK);
    expect_true(len == need && text[len] == 0 && strlen(text) == len);
    expect_true(strstr(text, "cpcache_steps_total{") != NULL && strstr(text, "cpcache_l1_capacity_pages{") != NULL);
    free(text);
  }

  // match and insert: NULL pointers, short buffers — nothing changes.
  int32_t tokens[4 * PAGE_TOKENS];
  for (int i = 0; i < 4 * PAGE_TOKENS; i++) tokens[i] = 100 + i;
  cpcache_match_result m;
  cpcache_insert_result ins;
  int32_t slots[4];
  cpcache_fill_page fill[4];
  expect(cpcache_match(c, NULL, 16, &m, slots, 4), CPCACHE_ERR_INVALID);
  expect(cpcache_match(c, tokens, 16, NULL, slots, 4), CPCACHE_ERR_INVALID);
  expect(cpcache_match(c, tokens, 16, &m, slots, 3), CPCACHE_ERR_SIZE);
  expect(cpcache_match(c, tokens, 16, &m, NULL, 4), CPCACHE_ERR_INVALID);
  expect(cpcache_insert(c, NULL, 16, &ins, fill, 4), CPCACHE_ERR_INVALID);
  expect(cpcache_insert(c, tokens, 16, NULL, fill, 4), CPCACHE_ERR_INVALID);
  expect(cpcache_insert(c, tokens, 16, &ins, fill, 3), CPCACHE_ERR_SIZE);
  expect(cpcache_insert(c, tokens, 16, &ins, NULL, 0), CPCACHE_ERR_INVALID);
  expect(cpcache_get_stats(c, &st), CPCACHE_OK);
  expect_true(st.matches == 0 && st.inserts == 0 && st.nodes == 0);

  // Node handles that name nothing.
  expect(cpcache_lock(c, 0), CPCACHE_ERR_NODE);
  expect(cpcache_unlock(c, 0xdeadbeef), CPCACHE_ERR_NODE);
  expect(cpcache_load_back(c, 42, NULL), CPCACHE_ERR_NODE);
  expect(cpcache_wait_l1(c, 42, 0), CPCACHE_ERR_NODE);
  expect(cpcache_wait_l1_layer(c, 42, 0, 0), CPCACHE_ERR_NODE);

  // L1 slots out of range, NULL outputs, negative counts.
  void *page;
  size_t len;
  expect(cpcache_l1_page(c, -1, &page, &len), CPCACHE_ERR_RANGE);
  expect(cpcache_l1_page(c, L1_PAGES, &page, &len), CPCACHE_ERR_RANGE);
  expect(cpcache_l1_page(c, 0, NULL, &len), CPCACHE_ERR_INVALID);
  expect(cpcache_l1_page(c, 0, &page, NULL), CPCACHE_ERR_INVALID);
  expect(cpcache_evict_l1(c, -1, NULL), CPCACHE_ERR_INVALID);
  expect(cpcache_evict_l2(c, -5, NULL), CPCACHE_ERR_INVALID);
  expect(cpcache_pending(c, NULL), CPCACHE_ERR_INVALID);
  expect(cpcache_prefetch(c, tokens, 16, NULL), CPCACHE_ERR_INVALID);
  expect(cpcache_prefetch_pending(c, 1, NULL), CPCACHE_ERR_INVALID);

  // A correct round: insert, write the pages, step, match hits them in L1.
  expect(cpcache_insert(c, tokens, 16, &ins, fill, 4), CPCACHE_OK);
  expect_true(ins.pages == 4 && ins.n_fill == 4 && ins.node != 0);
  for (int i = 0; i < ins.n_fill; i++) {
    expect_true(fill[i].owned == 1 && fill[i].index == i);
    expect(cpcache_l1_page(c, fill[i].slot, &page, &len), CPCACHE_OK);
    expect_true(len == PAGE_BYTES);
    memset(page, 0x40 + i, len);
  }
  expect(cpcache_step(c), CPCACHE_OK);
  expect(cpcache_match(c, tokens, 16, &m, slots, 4), CPCACHE_OK);
  expect_true(m.node == ins.node && m.device_pages == 4 && m.host_pages == 0);
  for (int i = 0; i < 4; i++) expect_true(slots[i] == fill[i].slot);
  cpcache_node_t node = m.node;

  // Load-back: once the backup committed and L1 dropped the pages, they come back from L2
  // with the bytes written above. wait_l1 before the step that starts the copies fails.
  int64_t pending = -1;
  for (;;) {
    expect(cpcache_pending(c, &pending), CPCACHE_OK);
    if (pending <= 0) break;
    expect(cpcache_step(c), CPCACHE_OK);
  }
  int64_t freed = 0;
  expect(cpcache_evict_l1(c, 4, &freed), CPCACHE_OK);
  expect_true(freed == 4);
  expect(cpcache_match(c, tokens, 16, &m, slots, 4), CPCACHE_OK);
  expect_true(m.device_pages == 0 && m.host_pages == 4);
  expect(cpcache_lock(c, m.node), CPCACHE_OK);
  int64_t loading = 0;
  expect(cpcache_load_back(c, m.node, &loading), CPCACHE_OK);
  expect_true(loading == 4);
  expect(cpcache_wait_l1(c, m.node, 0), CPCACHE_ERR_NOT_STARTED);
  expect(cpcache_wait_l1_layer(c, m.node, 0, 0), CPCACHE_ERR_NOT_STARTED);
  expect(cpcache_wait_l1_layer(c, m.node, -1, 0), CPCACHE_ERR_INVALID);
  expect_true(strstr(cpcache_last_error(), "layer -1") != NULL);
  // The library's host L1 has no CUDA stream to make wait: the configuration's error,
  // named, and nothing else changes.
  expect(cpcache_wait_l1_layer_on(c, m.node, 0, NULL), CPCACHE_ERR_CONFIG);
  expect_true(strstr(cpcache_last_error(), "stream") != NULL);
  expect(cpcache_load_pending(c, m.node, NULL), CPCACHE_ERR_INVALID);
  int32_t load_pending = 1;
  for (int i = 0; i < 10000 && load_pending; i++) { // the copy workers may be slow to run: 10 s
    expect(cpcache_step(c), CPCACHE_OK);
    expect(cpcache_load_pending(c, m.node, &load_pending), CPCACHE_OK);
    if (load_pending) usleep(1000);
  }
  expect_true(load_pending == 0);
  expect(cpcache_wait_l1(c, m.node, 10000), CPCACHE_OK);
  // The host engine loads whole pages: every layer's wait is the whole load's, over now.
  expect(cpcache_wait_l1_layer(c, m.node, 0, 10000), CPCACHE_OK);
  expect(cpcache_wait_l1_layer(c, m.node, 31, -1), CPCACHE_OK);
  expect(cpcache_match(c, tokens, 16, &m, slots, 4), CPCACHE_OK);
  expect_true(m.device_pages == 4 && m.node == node);
  for (int i = 0; i < 4; i++) {
    expect(cpcache_l1_page(c, slots[i], &page, &len), CPCACHE_OK);
    expect_true(((unsigned char *)page)[0] == 0x40 + i && ((unsigned char *)page)[len - 1] == 0x40 + i);
  }
  expect(cpcache_unlock(c, m.node), CPCACHE_OK);
  int32_t short_tokens[3] = {1, 2, 3}; // less than a page: no slots wanted, none needed
  expect(cpcache_match(c, short_tokens, 3, &m, NULL, 0), CPCACHE_OK);
  expect(cpcache_insert(c, short_tokens, 3, &ins, NULL, 0), CPCACHE_OK);
  expect_true(ins.pages == 0 && ins.n_fill == 0);

  // Flush while a node is locked: busy, nothing changes; then unlocked, it empties.
  expect(cpcache_lock(c, node), CPCACHE_OK);
  for (;;) {
    expect(cpcache_pending(c, &pending), CPCACHE_OK);
    if (pending <= 0) break;
    expect(cpcache_step(c), CPCACHE_OK);
  }
  expect(cpcache_flush(c), CPCACHE_ERR_BUSY);
  expect(cpcache_unlock(c, node), CPCACHE_OK);
  expect(cpcache_flush(c), CPCACHE_OK);
  expect(cpcache_lock(c, node), CPCACHE_ERR_NODE); // a handle from before the flush
  expect_true(strstr(cpcache_last_error(), "before a flush") != NULL);
  expect(cpcache_get_stats(c, &st), CPCACHE_OK);
  expect_true(st.nodes == 0 && st.l1_used == 0);

  // A handle whose node left the cache (evicted from L1 and L2) names no node: the same
  // CPCACHE_ERR_NODE as a handle from before a flush (not CPCACHE_ERR_INVALID).
  expect(cpcache_insert(c, tokens, 16, &ins, fill, 4), CPCACHE_OK);
  for (;;) {
    expect(cpcache_step(c), CPCACHE_OK);
    expect(cpcache_pending(c, &pending), CPCACHE_OK);
    if (pending <= 0) break;
  }
  expect(cpcache_evict_l1(c, 4, &freed), CPCACHE_OK);
  expect(cpcache_evict_l2(c, 4, &freed), CPCACHE_OK);
  expect_true(freed == 4);
  expect(cpcache_lock(c, ins.node), CPCACHE_ERR_NODE);
  expect(cpcache_unlock(c, ins.node), CPCACHE_ERR_NODE);
  expect(cpcache_load_back(c, ins.node, NULL), CPCACHE_ERR_NODE);
  expect(cpcache_match(c, tokens, 16, &m, slots, 4), CPCACHE_OK);
  expect_true(m.device_pages == 0 && m.host_pages == 0);

  // The last error is per thread.
  expect(cpcache_lock(c, 0), CPCACHE_ERR_NODE);
  pthread_t t;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, NULL);
  expect_true(strstr(cpcache_last_error(), "node handle 0") != NULL);

  // Signals: the engine's SIGINT handler still runs with the Go runtime loaded (Go
  // installs no handler for it in a library), and a write to a broken pipe on an engine
  // thread fails with EPIPE instead of killing the process (Gloo made the runtime catch
  // SIGPIPE; it forwards signals on non-Go threads to the previous disposition, which for
  // an engine that ignores SIGPIPE, as most servers do, is "ignore").
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
  raise(SIGINT);
  expect_true(got_sigint == 1);
  signal(SIGPIPE, SIG_IGN);
  int fds[2];
  if (pipe(fds) == 0) {
    close(fds[0]);
    expect_true(write(fds[1], "x", 1) == -1 && errno == EPIPE);
    close(fds[1]);
  }
  expect(cpcache_step(c), CPCACHE_OK);

  // Capacities are bounds: SIZE_MAX (a C caller's "as many as there are") works and writes
  // only the entries returned: the library makes no Go slice of SIZE_MAX entries (a panic,
  // CPCACHE_ERR_INTERNAL).
  int32_t cap_tokens[2 * PAGE_TOKENS];
  for (int i = 0; i < 2 * PAGE_TOKENS; i++) cap_tokens[i] = 7000 + i;
  cpcache_fill_page big_fill[4];
  memset(big_fill, 0xab, sizeof big_fill);
  expect(cpcache_insert(c, cap_tokens, 2 * PAGE_TOKENS, &ins, big_fill, SIZE_MAX), CPCACHE_OK);
  expect_true(ins.pages == 2 && ins.n_fill == 2 && big_fill[1].index == 1);
  expect_true(((unsigned char *)&big_fill[2])[0] == 0xab && ((unsigned char *)&big_fill[3])[sizeof big_fill[3] - 1] == 0xab);
  int32_t big_slots[4] = {-7, -7, -7, -7};
  expect(cpcache_match(c, cap_tokens, 2 * PAGE_TOKENS, &m, big_slots, SIZE_MAX), CPCACHE_OK);
  expect_true(m.device_pages == 2 && big_slots[0] == big_fill[0].slot && big_slots[1] == big_fill[1].slot);
  expect_true(big_slots[2] == -7 && big_slots[3] == -7);
  expect(cpcache_match(c, cap_tokens, 2 * PAGE_TOKENS, &m, big_slots, SIZE_MAX / 2 + 1), CPCACHE_OK);
  // Token counts near the top of size_t are refused, naming the value.
  expect(cpcache_match(c, cap_tokens, SIZE_MAX, &m, big_slots, SIZE_MAX), CPCACHE_ERR_INVALID);
  expect_true(strstr(cpcache_last_error(), "18446744073709551615") != NULL);
  expect(cpcache_insert(c, cap_tokens, SIZE_MAX - 3, &ins, big_fill, SIZE_MAX), CPCACHE_ERR_INVALID);
  uint64_t prefetch_id = 0;
  expect(cpcache_prefetch(c, cap_tokens, SIZE_MAX, &prefetch_id), CPCACHE_ERR_INVALID);

  // A panic in the library is CPCACHE_ERR_INTERNAL with a one-line message naming the call
  // and the panic, never a goroutine stack: a pointer just above NULL (a field of a NULL
  // struct pointer) faults in Go, which the runtime turns into a nil-dereference panic.
  expect(cpcache_get_stats(c, (cpcache_stats *)(uintptr_t)8), CPCACHE_ERR_INTERNAL);
  expect_true(strstr(cpcache_last_error(), "cpcache_get_stats: panic at ") != NULL);
  expect_true(strstr(cpcache_last_error(), "nil pointer dereference") != NULL);
  expect_true(strchr(cpcache_last_error(), '\n') == NULL && strstr(cpcache_last_error(), "goroutine") == NULL);
  expect(cpcache_get_info(c, (cpcache_info *)(uintptr_t)16), CPCACHE_ERR_INTERNAL);
  expect_true(strchr(cpcache_last_error(), '\n') == NULL);
  expect(cpcache_step(c), CPCACHE_OK); // the cache is unharmed
  expect(cpcache_get_stats(c, &st), CPCACHE_OK);

  // A live node handle, to be stale once the cache is closed.
  expect(cpcache_insert(c, tokens, 16, &ins, fill, 4), CPCACHE_OK);
  cpcache_node_t stale_node = ins.node;

  // Close: idempotent; every other call on the handle then fails.
  expect(cpcache_close(c), CPCACHE_OK);
  expect(cpcache_close(c), CPCACHE_OK);
  expect(cpcache_abort(c), CPCACHE_OK); // aborting a closed handle: nothing to do
  expect(cpcache_step(c), CPCACHE_ERR_CLOSED);
  expect(cpcache_match(c, tokens, 16, &m, slots, 4), CPCACHE_ERR_CLOSED);
  expect(cpcache_insert(c, tokens, 16, &ins, fill, 4), CPCACHE_ERR_CLOSED);
  expect(cpcache_lock(c, 1), CPCACHE_ERR_CLOSED);
  expect(cpcache_wait_l1(c, 1, 0), CPCACHE_ERR_CLOSED);
  expect(cpcache_wait_l1_layer(c, 1, 0, 0), CPCACHE_ERR_CLOSED);
  expect(cpcache_wait_l1_layer_on(c, 1, 0, NULL), CPCACHE_ERR_CLOSED);
  expect(cpcache_l1_page(c, 0, &page, &len), CPCACHE_ERR_CLOSED);
  expect(cpcache_get_stats(c, &st), CPCACHE_ERR_CLOSED);
  expect(cpcache_flush(c), CPCACHE_ERR_CLOSED);

  // A process may open again after closing; the new handle differs.
  base_config(&cfg);
  expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
  expect_true(c2 != c);
  expect(cpcache_step(c), CPCACHE_ERR_CLOSED);
  expect(cpcache_step(c2), CPCACHE_OK);
  // A node handle of a closed cache names no node of a later one (node ids restart at
  // open: it must not name the new cache's node of the same id, whatever its tokens).
  expect(cpcache_lock(c2, stale_node), CPCACHE_ERR_NODE);
  expect(cpcache_insert(c2, tokens, 16, &ins, fill, 4), CPCACHE_OK);
  stale_node = ins.node;
  expect(cpcache_close(c2), CPCACHE_OK);
  base_config(&cfg);
  expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
  int32_t other[4 * PAGE_TOKENS];
  for (int i = 0; i < 4 * PAGE_TOKENS; i++) other[i] = 900 + i;
  expect(cpcache_insert(c2, other, 16, &ins, fill, 4), CPCACHE_OK);
  expect_true(ins.node != stale_node);
  expect(cpcache_lock(c2, stale_node), CPCACHE_ERR_NODE);
  expect(cpcache_unlock(c2, stale_node), CPCACHE_ERR_NODE);
  expect(cpcache_close(c2), CPCACHE_OK);

  // Eviction under write_back: evicting a page without an L2 copy starts its backup and
  // frees the slot once the backup commits. cpcache_evict_l1 reports only pages freed now
  // (0 here); cpcache_evict_l1_ex reports the pending ones too, never more than asked, and
  // a repeated request counts the pages still pending and starts no more.
  base_config(&cfg);
  cfg.policy = CPCACHE_POLICY_WRITE_BACK;
  expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
  int32_t wb[8 * PAGE_TOKENS];
  cpcache_fill_page wb_fill[8];
  for (int i = 0; i < 8 * PAGE_TOKENS; i++) wb[i] = 3000 + i;
  expect(cpcache_insert(c2, wb, 8 * PAGE_TOKENS, &ins, wb_fill, 8), CPCACHE_OK);
  expect(cpcache_step(c2), CPCACHE_OK);
  expect(cpcache_evict_l1_ex(c2, -2, NULL, NULL), CPCACHE_ERR_INVALID);
  int64_t wb_freed = -1, wb_pending = -1;
  expect(cpcache_evict_l1_ex(c2, 2, &wb_freed, &wb_pending), CPCACHE_OK);
  expect_true(wb_freed == 0 && wb_pending == 2);
  expect(cpcache_evict_l1_ex(c2, 2, &wb_freed, &wb_pending), CPCACHE_OK);
  expect_true(wb_freed == 0 && wb_pending == 2);
  expect(cpcache_evict_l1(c2, 2, &wb_freed), CPCACHE_OK);
  expect_true(wb_freed == 0);
  expect(cpcache_evict_l1_ex(c2, 2, NULL, NULL), CPCACHE_OK);
  for (int i = 0; i < 10000; i++) {
    expect(cpcache_step(c2), CPCACHE_OK);
    expect(cpcache_pending(c2, &pending), CPCACHE_OK);
    if (pending <= 0) break;
    usleep(1000);
  }
  expect(cpcache_get_stats(c2, &st), CPCACHE_OK);
  expect_true(st.l1_used == 6 && st.evicted_l1_pages == 2 && st.written_pages == 2);
  expect(cpcache_match(c2, wb, 8 * PAGE_TOKENS, &m, NULL, 0), CPCACHE_OK);
  expect_true(m.device_pages == 6 && m.host_pages == 2);
  expect(cpcache_close(c2), CPCACHE_OK);

  // ABI 1: a caller built against the ABI-1 header passes a config of the old size (the
  // fields before kv_layout) with abi_version 1; it opens with the ABI-2 fields defaulted.
  {
    unsigned char old[sizeof(cpcache_config) + 64];
    memset(old, 0xAB, sizeof old); // bytes past the old struct are not the caller's: never read
    base_config(&cfg);
    memcpy(old, &cfg, CPCACHE_CONFIG_SIZE_V1);
    cpcache_config *v1 = (cpcache_config *)old;
    v1->struct_size = CPCACHE_CONFIG_SIZE_V1;
    v1->abi_version = 2; // the old size with the new version is neither
    expect(cpcache_open(v1, &c2), CPCACHE_ERR_SIZE);
    expect_true(strstr(cpcache_last_error(), "ABI-1") != NULL);
    v1->abi_version = 1;
    expect(cpcache_open(v1, &c2), CPCACHE_OK);
    expect(cpcache_get_info(c2, &info), CPCACHE_OK);
    expect_true(info.page_bytes == PAGE_BYTES && info.l1_pages == L1_PAGES);
    int64_t kvb = 0;
    expect(cpcache_kv_page_bytes(c2, &kvb), CPCACHE_ERR_INVALID); // opaque pages
    expect_true(strstr(cpcache_last_error(), "no KV layout") != NULL);
    // The L1 mode is the default (the 0xAB bytes where l1_mode lies are not read): the cache
    // picks slots, the engine-owned calls are refused.
    int32_t v1_tokens[PAGE_TOKENS] = {1, 2, 3, 4}, v1_slot = 0;
    size_t v1_n = 9;
    expect(cpcache_insert(c2, v1_tokens, PAGE_TOKENS, &ins, fill, 4), CPCACHE_OK);
    expect(cpcache_insert_slots(c2, NULL, 0, v1_tokens, PAGE_TOKENS, &v1_slot, 1, &ins, NULL, 0, &v1_n), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "L1 mode") != NULL);
    expect(cpcache_take_freed_l1(c2, NULL, 0, &v1_n), CPCACHE_OK);
    expect_true(v1_n == 0);
    expect(cpcache_close(c2), CPCACHE_OK);
  }

  // ABI 2: a config of the ABI-2 header (the fields before store) with abi_version 2 opens
  // with the ABI-3 fields defaulted (no store callbacks, job id or local world).
  {
    unsigned char old[sizeof(cpcache_config) + 64];
    memset(old, 0xAB, sizeof old); // bytes past the old struct are not the caller's: never read
    base_config(&cfg);
    memcpy(old, &cfg, CPCACHE_CONFIG_SIZE_V2);
    cpcache_config *v2 = (cpcache_config *)old;
    v2->struct_size = CPCACHE_CONFIG_SIZE_V2;
    v2->abi_version = CPCACHE_ABI_VERSION; // the old size with the new version is neither
    expect(cpcache_open(v2, &c2), CPCACHE_ERR_SIZE);
    expect_true(strstr(cpcache_last_error(), "ABI-2") != NULL);
    v2->abi_version = 2;
    expect(cpcache_open(v2, &c2), CPCACHE_OK);
    expect(cpcache_get_info(c2, &info), CPCACHE_OK);
    expect_true(info.page_bytes == PAGE_BYTES && info.l1_pages == L1_PAGES);
    expect(cpcache_close(c2), CPCACHE_OK);
  }

  // A store URL and store callbacks together are CPCACHE_ERR_INVALID naming both; a store
  // with a NULL callback names it.
  {
    cpcache_store cbs;
    memset(&cbs, 0, sizeof cbs);
    base_config(&cfg);
    cfg.store = &cbs;
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "callback set, get, add, del is NULL") != NULL);
    cbs.set = no_set, cbs.get = no_get, cbs.add = no_add, cbs.del = no_del;
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "both cpcache_config.store_url") != NULL);

    // The engine's own store as callbacks: the rank meets through it (store_url NULL), with
    // a job id, touching no key outside "cpcache/"; the engine's key stays. Twice in a row.
    cpcache_store engine = {.ctx = NULL, .set = mem_set, .get = mem_get, .add = mem_add, .del = mem_del};
    pthread_mutex_lock(&mem.mu);
    mem_put("engine/own", "v", 1);
    pthread_mutex_unlock(&mem.mu);
    for (int i = 0; i < 2; i++) {
      base_config(&cfg);
      cfg.store_url = NULL;
      cfg.store = &engine;
      cfg.job_id = "c-engine";
      cfg.local_world = 1;
      expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
      expect(cpcache_close(c2), CPCACHE_OK);
    }
    pthread_mutex_lock(&mem.mu);
    int own = mem_find("engine/own");
    expect_true(mem.calls > 0 && mem.foreign == 0 && own >= 0 && mem.len[own] == 1);
    pthread_mutex_unlock(&mem.mu);
  }

  // KV layouts: a bad one is CPCACHE_ERR_INVALID naming the bad value or part.
  {
    base_config(&cfg);
    cfg.kv_layout = "no-such-model";
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "no-such-model") != NULL);
    cfg.kv_layout = "layers=2;k=16:sharded;v=16:sharded"; // 2 × 32 B a token × 4 tokens = 256 B a page
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID); // page_bytes 64 is not the layout's
    expect_true(strstr(cpcache_last_error(), "256") != NULL);
    cpcache_kv_part parts[2] = {{"k", 16, CPCACHE_KV_SHARDED, 0}, {"v", 16, 7, 0}};
    base_config(&cfg);
    cfg.page_bytes = 0;
    cfg.kv_parts = parts, cfg.kv_num_parts = 2, cfg.kv_num_layers = 2;
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "kv_parts[1] (\"v\"): sharding 7") != NULL);
    parts[1].sharding = CPCACHE_KV_SHARDED;
    cfg.l2_layout = 9;
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "l2_layout 9") != NULL);

    // Per-layer buffers: SGLang-like token-slot K and V for each of the 2 layers.
    enum { ROW = 16 };
    static unsigned char kv[2][2][L1_PAGES * PAGE_TOKENS * ROW];
    cpcache_l1_buffer bufs[4];
    for (int l = 0; l < 2; l++)
      for (int j = 0; j < 2; j++)
        bufs[l * 2 + j] = cpcache_l1_token_slot_buffer(l, j, CPCACHE_MEM_HOST, kv[l][j], L1_PAGES, PAGE_TOKENS, ROW);
    cfg.l2_layout = CPCACHE_L2_LAYER_FIRST;
    cfg.l1_buffers = bufs, cfg.l1_num_buffers = 4;
    bufs[3].bytes -= 1; // too small for its slots: named by layer and part
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "layer 1") != NULL && strstr(cpcache_last_error(), "part 1") != NULL);
    bufs[3].bytes += 1;
    bufs[3].base = kv[1][0]; // overlaps layer 1's K
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "overlap") != NULL);
    bufs[3].base = kv[1][1];
    expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
    int64_t bpt = 0, pb = 0;
    expect(cpcache_kv_bytes_per_token(c2, &bpt), CPCACHE_OK);
    expect(cpcache_kv_page_bytes(c2, &pb), CPCACHE_OK);
    expect_true(bpt == 64 && pb == 256);
    expect(cpcache_get_info(c2, &info), CPCACHE_OK);
    expect_true(info.page_bytes == 256);
    expect(cpcache_close(c2), CPCACHE_OK);

    // vLLM's block-major layer tensors [blocks, 2, page_tokens, row]: K and V interleave in
    // one tensor without overlapping (stride-aware); a V buffer shifted onto K's rows does.
    static unsigned char layer_kv[2][L1_PAGES * 2 * PAGE_TOKENS * ROW];
    for (int l = 0; l < 2; l++)
      for (int j = 0; j < 2; j++)
        bufs[l * 2 + j] = cpcache_l1_block_major_buffer(l, j, CPCACHE_MEM_HOST, layer_kv[l], L1_PAGES, PAGE_TOKENS, ROW, j);
    expect_true(bufs[1].page_stride == 2 * PAGE_TOKENS * ROW && (char *)bufs[1].base - (char *)bufs[0].base == PAGE_TOKENS * ROW);
    expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
    expect(cpcache_close(c2), CPCACHE_OK);
    bufs[1].base = (char *)bufs[1].base - ROW;
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "overlap") != NULL);
  }

  // Engine-owned L1 slots: the engine's slots in, freed slots out as lists; a bad slot list
  // is CPCACHE_ERR_INVALID naming the slot, and a small freed buffer loses nothing.
  {
    base_config(&cfg);
    expect_true(cfg.l1_mode == CPCACHE_L1_CACHE_OWNED);
    cfg.l1_mode = 7;
    expect(cpcache_open(&cfg, &c2), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "l1_mode 7") != NULL);
    cfg.l1_mode = CPCACHE_L1_ENGINE_OWNED;
    expect(cpcache_open(&cfg, &c2), CPCACHE_OK);
    int32_t es[2 * PAGE_TOKENS], own[3], out_slots[4];
    for (int i = 0; i < 2 * PAGE_TOKENS; i++) es[i] = 5000 + i;
    size_t nf = 99;
    expect(cpcache_insert(c2, es, 2 * PAGE_TOKENS, &ins, fill, 4), CPCACHE_ERR_INVALID); // the engine passes its slots
    expect_true(strstr(cpcache_last_error(), "InsertSlots") != NULL);
    own[0] = 0, own[1] = 99;
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "slot 99") != NULL && strstr(cpcache_last_error(), "outside the L1 pool") != NULL);
    own[0] = 3, own[1] = 3;
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "slot 3 (entry 1") != NULL);
    own[1] = -1;
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "slot -1") != NULL);
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 1, &ins, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "1 slots for the 2 pages") != NULL);
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, NULL, 2, &ins, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    own[0] = 5, own[1] = 6;
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, out_slots, 4, NULL), CPCACHE_ERR_INVALID);
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, NULL, 4, &nf), CPCACHE_ERR_INVALID);
    expect(cpcache_get_stats(c2, &st), CPCACHE_OK);
    expect_true(st.l1_used == 0 && st.inserts == 0); // the bad calls changed nothing
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, out_slots, 4, &nf), CPCACHE_OK);
    expect_true(ins.pages == 2 && nf == 0);
    expect(cpcache_get_stats(c2, &st), CPCACHE_OK);
    expect_true(st.l1_used == 2);
    int64_t used_by = -1;
    expect(cpcache_l1_used_by(c2, 0, &used_by), CPCACHE_OK);
    expect_true(used_by == 2);
    expect(cpcache_l1_used_by(c2, 1, &used_by), CPCACHE_ERR_INVALID); // a world of one CP rank
    expect_true(strstr(cpcache_last_error(), "CP rank 1") != NULL);
    expect(cpcache_l1_used_by(c2, 0, NULL), CPCACHE_ERR_INVALID);
    expect(cpcache_match(c2, es, 2 * PAGE_TOKENS, &m, out_slots, 4), CPCACHE_OK);
    expect_true(m.device_pages == 2 && out_slots[0] == 5 && out_slots[1] == 6); // the engine's slots
    // Slot 5 holds page 0: another sequence's page may not take it.
    int32_t other_seq[PAGE_TOKENS] = {1, 1, 1, 1};
    expect(cpcache_insert_slots(c2, NULL, 0, other_seq, PAGE_TOKENS, own, 1, &ins, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "slot 5") != NULL && strstr(cpcache_last_error(), "held by the cache") != NULL);
    // The same pages again with fresh slots: already in L1, so both slots come back; a
    // one-entry buffer gets the first, the drain the second.
    own[0] = 7, own[1] = 8;
    expect(cpcache_insert_slots(c2, NULL, 0, es, 2 * PAGE_TOKENS, own, 2, &ins, out_slots, 1, &nf), CPCACHE_OK);
    expect_true(nf == 2 && out_slots[0] == 7);
    expect(cpcache_take_freed_l1(c2, out_slots, 4, &nf), CPCACHE_OK);
    expect_true(nf == 1 && out_slots[0] == 8);
    expect(cpcache_take_freed_l1(c2, out_slots, 4, &nf), CPCACHE_OK);
    expect_true(nf == 0);
    expect(cpcache_take_freed_l1(c2, NULL, 4, &nf), CPCACHE_ERR_INVALID);
    for (;;) { // the backups to L2 (write_through)
      expect(cpcache_step(c2), CPCACHE_OK);
      expect(cpcache_pending(c2, &pending), CPCACHE_OK);
      if (pending <= 0) break;
      usleep(1000);
    }
    int64_t ev = 0, ev_pending = -1;
    expect(cpcache_evict_l1_slots(c2, -1, &ev, &ev_pending, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect(cpcache_evict_l1_slots(c2, 2, &ev, &ev_pending, out_slots, 4, &nf), CPCACHE_OK);
    expect_true(ev == 2 && ev_pending == 0 && nf == 2);
    expect_true((out_slots[0] == 5 && out_slots[1] == 6) || (out_slots[0] == 6 && out_slots[1] == 5));
    // Load back into the engine's slots: the plan says how many it wants.
    expect(cpcache_match(c2, es, 2 * PAGE_TOKENS, &m, NULL, 0), CPCACHE_OK);
    expect_true(m.device_pages == 0 && m.host_pages == 2);
    int64_t plan[2] = {-1, -1};
    size_t np = 0;
    expect(cpcache_load_back_plan(c2, m.node, plan, 1, &np), CPCACHE_ERR_SIZE);
    expect_true(np == 2);
    expect(cpcache_load_back_plan(c2, m.node, NULL, 0, &np), CPCACHE_OK);
    expect_true(np == 2);
    expect(cpcache_load_back_plan(c2, m.node, plan, 2, NULL), CPCACHE_ERR_INVALID);
    expect(cpcache_load_back_plan(c2, 42, plan, 2, &np), CPCACHE_ERR_NODE);
    expect(cpcache_load_back_plan(c2, m.node, plan, 2, &np), CPCACHE_OK);
    expect_true(np == 2 && plan[0] == 0 && plan[1] == 1);
    expect(cpcache_load_back(c2, m.node, &loading), CPCACHE_ERR_INVALID); // the engine passes its slots
    own[0] = 10, own[1] = L1_PAGES;
    expect(cpcache_load_back_slots(c2, m.node, own, 2, &loading, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    expect_true(strstr(cpcache_last_error(), "slot 16") != NULL);
    expect(cpcache_load_back_slots(c2, m.node, own, 1, &loading, out_slots, 4, &nf), CPCACHE_ERR_INVALID);
    own[1] = 11;
    expect(cpcache_load_back_slots(c2, m.node, own, 2, &loading, out_slots, 4, &nf), CPCACHE_OK);
    expect_true(loading == 2 && nf == 0);
    int32_t lp = 1;
    for (int i = 0; i < 10000 && lp; i++) {
      expect(cpcache_step(c2), CPCACHE_OK);
      expect(cpcache_load_pending(c2, m.node, &lp), CPCACHE_OK);
      if (lp) usleep(1000);
    }
    expect(cpcache_wait_l1(c2, m.node, 10000), CPCACHE_OK);
    expect(cpcache_match(c2, es, 2 * PAGE_TOKENS, &m, out_slots, 4), CPCACHE_OK);
    expect_true(m.device_pages == 2 && out_slots[0] == 10 && out_slots[1] == 11);
    // A flush lets every slot go: the drain hands them back.
    expect(cpcache_flush(c2), CPCACHE_OK);
    expect(cpcache_take_freed_l1(c2, out_slots, 4, &nf), CPCACHE_OK);
    expect_true(nf == 2 && ((out_slots[0] == 10 && out_slots[1] == 11) || (out_slots[0] == 11 && out_slots[1] == 10)));
    // Token locations: page slot s is locations s*PAGE_TOKENS.. ; a page's locations must be
    // page-aligned and contiguous; a freed buffer too small for every page queues the rest.
    {
      int64_t locs[2 * PAGE_TOKENS], got[2 * PAGE_TOKENS], freed_locs[2 * PAGE_TOKENS];
      int32_t slots2[2];
      for (int i = 0; i < 2 * PAGE_TOKENS; i++) locs[i] = 7 * PAGE_TOKENS + i; // slots 7 and 8
      locs[PAGE_TOKENS] = 8 * PAGE_TOKENS + 1;
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, NULL, 0, NULL),
             CPCACHE_ERR_INVALID);
      expect_true(strstr(cpcache_last_error(), "locs[4] = 33 does not start a page") != NULL);
      locs[PAGE_TOKENS] = 8 * PAGE_TOKENS, locs[PAGE_TOKENS + 2] = 0;
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, NULL, 0, NULL),
             CPCACHE_ERR_INVALID);
      expect_true(strstr(cpcache_last_error(), "locs[6] = 0") != NULL && strstr(cpcache_last_error(), "contiguous") != NULL);
      locs[PAGE_TOKENS + 2] = 8 * PAGE_TOKENS + 2;
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, PAGE_TOKENS, &ins, freed_locs, 8, &nf, NULL, 0, NULL),
             CPCACHE_ERR_INVALID);
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, NULL, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, NULL, 0, NULL),
             CPCACHE_ERR_INVALID);
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, 2 * PAGE_TOKENS, &ins, freed_locs, 8, NULL, NULL, 0, NULL),
             CPCACHE_ERR_INVALID);
      expect(cpcache_get_stats(c2, &st), CPCACHE_OK);
      expect_true(st.l1_used == 0); // the bad calls changed nothing
      size_t nk = 0;
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, got,
                                 PAGE_TOKENS, &nk),
             CPCACHE_ERR_SIZE);
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, got,
                                 2 * PAGE_TOKENS, NULL),
             CPCACHE_ERR_INVALID);
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, locs, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, NULL,
                                 0, NULL),
             CPCACHE_OK);
      expect_true(ins.pages == 2 && nf == 0);
      // Again under other locations (slots 1 and 2): they come back; kept gets the cache's.
      for (int i = 0; i < 2 * PAGE_TOKENS; i++) got[i] = PAGE_TOKENS + i;
      expect(cpcache_insert_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, got, 2 * PAGE_TOKENS, &ins, freed_locs, 8, &nf, got,
                                 2 * PAGE_TOKENS, &nk),
             CPCACHE_OK);
      expect_true(nf == 2 * PAGE_TOKENS && freed_locs[0] == PAGE_TOKENS && nk == 2 * PAGE_TOKENS);
      expect_true(got[0] == 7 * PAGE_TOKENS && got[2 * PAGE_TOKENS - 1] == 9 * PAGE_TOKENS - 1);
      expect(cpcache_match_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, &m, got, PAGE_TOKENS, NULL, 0), CPCACHE_ERR_SIZE);
      expect(cpcache_match_locs(c2, NULL, 0, es, 2 * PAGE_TOKENS, &m, got, 2 * PAGE_TOKENS, slots2, 2), CPCACHE_OK);
      expect_true(m.device_pages == 2 && got[0] == 7 * PAGE_TOKENS && got[2 * PAGE_TOKENS - 1] == 9 * PAGE_TOKENS - 1);
      expect_true(slots2[0] == 7 && slots2[1] == 8);
      while (cpcache_pending(c2, &ev) == CPCACHE_OK && ev > 0) expect(cpcache_step(c2), CPCACHE_OK);
      // Room for 16 pages: both cached pages go; a buffer of one page takes the first, the
      // other waits for cpcache_take_freed_locs.
      int32_t room = -1;
      expect(cpcache_make_room(c2, 0, L1_PAGES * PAGE_TOKENS, NULL, &room, freed_locs, PAGE_TOKENS, NULL),
             CPCACHE_ERR_INVALID);
      expect(cpcache_make_room(c2, 5, 4, NULL, &room, freed_locs, PAGE_TOKENS, &nf), CPCACHE_ERR_INVALID);
      expect(cpcache_make_room(c2, 0, L1_PAGES * PAGE_TOKENS, NULL, &room, freed_locs, PAGE_TOKENS, &nf), CPCACHE_OK);
      expect_true(room == 1 && nf == 2 * PAGE_TOKENS);
      expect(cpcache_take_freed_locs(c2, freed_locs + PAGE_TOKENS, PAGE_TOKENS, &nf), CPCACHE_OK);
      expect_true(nf == PAGE_TOKENS && freed_locs[0] % PAGE_TOKENS == 0 && freed_locs[PAGE_TOKENS] % PAGE_TOKENS == 0 &&
                  freed_locs[0] + freed_locs[PAGE_TOKENS] == 15 * PAGE_TOKENS);
      expect(cpcache_evict_locs(c2, -1, NULL, NULL, freed_locs, 8, &nf), CPCACHE_ERR_INVALID);
      expect(cpcache_evict_locs(c2, 1, NULL, NULL, freed_locs, 8, &nf), CPCACHE_OK);
      expect_true(nf == 0);
    }
    expect(cpcache_close(c2), CPCACHE_OK);
    expect(cpcache_take_freed_l1(c2, out_slots, 4, &nf), CPCACHE_ERR_CLOSED);
  }

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "bad_calls: could not remove %s\n", dir);
  if (failures) {
    fprintf(stderr, "bad_calls: %d check(s) failed\n", failures);
    return 1;
  }
  printf("bad_calls: all checks passed\n");
  return 0;
}
