// fork.c — a child forked after cpcache_open gets CPCACHE_ERR_FORKED, at once, from every
// entry point (the message naming the parent's pid), touches nothing of the parent's cache,
// and exits promptly; the parent's cache keeps working (steps, inserts, matches, close). One
// process, a world of one rank; a second fork before any cache is open checks the same for
// the calls a process makes first (cpcache_version, cpcache_open). A child that hangs is
// killed after CHILD_DEADLINE_S and is a failure, so the test is bounded on a library
// without the check. Exit status 0 when every check holds.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpcache.h"

#ifndef CPCACHE_ERR_FORKED
#define CPCACHE_ERR_FORKED (-15) // a header older than the check: the test still builds, and fails
#endif

enum { PAGE_TOKENS = 4, PAGE_BYTES = 64, L1_PAGES = 16, CHILD_DEADLINE_S = 10 };

static int failures;
static char parent_pid[32];

// expect_forked: call returned CPCACHE_ERR_FORKED and the message names the parent's pid.
#define expect_forked(call)                                                                           \
  do {                                                                                                \
    int got_ = (call);                                                                                \
    if (got_ != CPCACHE_ERR_FORKED) {                                                                 \
      fprintf(stderr, "FAIL child: %s = %d, want CPCACHE_ERR_FORKED (%d); last error: %s\n", #call, \
              got_, CPCACHE_ERR_FORKED, cpcache_last_error());                                        \
      failures++;                                                                                     \
    } else if (!strstr(cpcache_last_error(), parent_pid)) {                                          \
      fprintf(stderr, "FAIL child: %s: message does not name the parent (%s): %s\n", #call,         \
              parent_pid, cpcache_last_error());                                                      \
      failures++;                                                                                     \
    }                                                                                                 \
  } while (0)

#define expect_ok(call)                                                                         \
  do {                                                                                          \
    int got_ = (call);                                                                          \
    if (got_ != CPCACHE_OK) {                                                                   \
      fprintf(stderr, "FAIL parent: %s = %d: %s\n", #call, got_, cpcache_last_error());         \
      failures++;                                                                               \
    }                                                                                           \
  } while (0)

// every_entry_point calls each function of the header that returns a status, with c and
// arguments that would be valid or invalid alike: the check comes before any of them is read.
static void every_entry_point(cpcache_t c) {
  cpcache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cpcache_t h = 0;
  int32_t tokens[2 * PAGE_TOKENS] = {1, 2, 3, 4, 5, 6, 7, 8};
  int32_t slots[L1_PAGES];
  int64_t i64 = 0, i64b = 0;
  int32_t i32 = 0;
  size_t n = 0;
  uint64_t id = 0;
  void *page = NULL;
  cpcache_info info = {.struct_size = sizeof info};
  cpcache_stats stats = {.struct_size = sizeof stats};
  cpcache_match_result m;
  cpcache_insert_result ins;
  cpcache_fill_page fill[L1_PAGES];
  expect_forked(cpcache_config_init(&cfg));
  expect_forked(cpcache_open(&cfg, &h));
  expect_forked(cpcache_get_info(c, &info));
  expect_forked(cpcache_kv_bytes_per_token(c, &i64));
  expect_forked(cpcache_kv_page_bytes(c, &i64));
  expect_forked(cpcache_match(c, tokens, 8, &m, slots, L1_PAGES));
  expect_forked(cpcache_match_key(c, "k", 1, tokens, 8, &m, slots, L1_PAGES));
  expect_forked(cpcache_lock(c, 1));
  expect_forked(cpcache_unlock(c, 1));
  expect_forked(cpcache_load_back(c, 1, &i64));
  expect_forked(cpcache_load_pending(c, 1, &i32));
  expect_forked(cpcache_wait_l1(c, 1, -1));
  expect_forked(cpcache_wait_l1_layer(c, 1, 0, -1));
  expect_forked(cpcache_wait_l1_layer_on(c, 1, 0, NULL));
  expect_forked(cpcache_insert(c, tokens, 8, &ins, fill, L1_PAGES));
  expect_forked(cpcache_insert_key(c, "k", 1, tokens, 8, &ins, fill, L1_PAGES));
  expect_forked(cpcache_evict_l1(c, 1, &i64));
  expect_forked(cpcache_evict_l1_ex(c, 1, &i64, &i64b));
  expect_forked(cpcache_insert_slots(c, NULL, 0, tokens, 8, slots, 2, &ins, slots, L1_PAGES, &n));
  expect_forked(cpcache_load_back_plan(c, 1, &i64, 1, &n));
  expect_forked(cpcache_load_back_slots(c, 1, slots, 0, &i64, slots, L1_PAGES, &n));
  expect_forked(cpcache_evict_l1_slots(c, 1, &i64, &i64b, slots, L1_PAGES, &n));
  expect_forked(cpcache_l1_used_by(c, 0, &i64));
  expect_forked(cpcache_take_freed_l1(c, slots, L1_PAGES, &n));
  expect_forked(cpcache_evict_l2(c, 1, &i64));
  expect_forked(cpcache_step(c));
  expect_forked(cpcache_pending(c, &i64));
  expect_forked(cpcache_flush(c));
  expect_forked(cpcache_prefetch(c, tokens, 8, &id));
  expect_forked(cpcache_prefetch_key(c, "k", 1, tokens, 8, &id));
  expect_forked(cpcache_prefetch_pending(c, 1, &i32));
  expect_forked(cpcache_prefetch_revoke(c, 1));
  expect_forked(cpcache_l1_page(c, 0, &page, &n));
  expect_forked(cpcache_get_stats(c, &stats));
  expect_forked(cpcache_close(c));
  expect_forked(cpcache_close(c)); // a second close: the same, nothing was closed
}

// run_child forks; the child runs body(c), checks the calls that return no status, and
// exits (through exit(), so destructors run) with its failure count. The parent waits at
// most CHILD_DEADLINE_S, then kills it: a hang is a failure, never a hung test.
static void run_child(const char *what, cpcache_t c, void (*body)(cpcache_t)) {
  const char *want_version = cpcache_version();
  char want[128];
  snprintf(want, sizeof want, "%s", want_version);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  if (pid == 0) {
    failures = 0;
    alarm(CHILD_DEADLINE_S + 5); // a hung child goes even if the parent died
    if (strcmp(cpcache_version(), want) != 0) {
      fprintf(stderr, "FAIL child: cpcache_version() = %s, want %s\n", cpcache_version(), want);
      failures++;
    }
    if (cpcache_abi_version() != CPCACHE_ABI_VERSION) {
      fprintf(stderr, "FAIL child: cpcache_abi_version() = %d\n", cpcache_abi_version());
      failures++;
    }
    body(c);
    exit(failures ? 1 : 0);
  }
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  int st = 0;
  for (;;) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= CHILD_DEADLINE_S) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      fprintf(stderr, "FAIL %s: the child did not exit within %d s (killed)\n", what, CHILD_DEADLINE_S);
      failures++;
      return;
    }
    usleep(10000);
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "FAIL %s: the child's status is %d\n", what, st);
    failures++;
  } else {
    printf("fork: %s: the child got CPCACHE_ERR_FORKED from every call and exited\n", what);
  }
}

static void no_cache(cpcache_t c) {
  (void)c;
  every_entry_point(0);
}

static void with_cache(cpcache_t c) { every_entry_point(c); }

static void base_config(cpcache_config *cfg, const char *store) {
  expect_ok(cpcache_config_init(cfg));
  cfg->world = 1;
  cfg->rank = 0;
  cfg->store_url = store;
  cfg->page_tokens = PAGE_TOKENS;
  cfg->page_bytes = PAGE_BYTES;
  cfg->l1_pages = L1_PAGES;
  cfg->l2_pages = 32;
}

// insert_and_step caches a fresh 2-page prompt (seed) and steps until nothing is pending.
static void insert_and_step(cpcache_t c, int seed) {
  int32_t tokens[2 * PAGE_TOKENS];
  for (int i = 0; i < 2 * PAGE_TOKENS; i++) tokens[i] = seed * 100 + i;
  cpcache_insert_result ins;
  cpcache_fill_page fill[2];
  expect_ok(cpcache_insert(c, tokens, 2 * PAGE_TOKENS, &ins, fill, 2));
  expect_ok(cpcache_step(c));
  int64_t pending = 1;
  for (int i = 0; i < 100 && pending; i++) {
    expect_ok(cpcache_pending(c, &pending));
    if (pending) expect_ok(cpcache_step(c));
  }
  cpcache_match_result m;
  expect_ok(cpcache_match(c, tokens, 2 * PAGE_TOKENS, &m, NULL, 0));
  if (m.device_pages != 2) {
    fprintf(stderr, "FAIL parent: match after insert %d: %lld device pages, want 2\n", seed,
            (long long)m.device_pages);
    failures++;
  }
}

int main(void) {
  snprintf(parent_pid, sizeof parent_pid, "pid %d", (int)getpid());
  char store[] = "/tmp/cpcache-fork-XXXXXX";
  if (!mkdtemp(store)) {
    perror("mkdtemp");
    return 2;
  }
  char url[300];
  snprintf(url, sizeof url, "file://%s", store);

  // 1. No cache open: the library is loaded (and its runtime started).
  run_child("no cache open", 0, no_cache);

  // 2. A cache open, with pages cached and steps made.
  cpcache_config cfg;
  base_config(&cfg, url);
  cpcache_t c = 0;
  expect_ok(cpcache_open(&cfg, &c));
  if (c == 0) {
    fprintf(stderr, "FAIL parent: no cache\n");
    return 1;
  }
  insert_and_step(c, 1);
  run_child("a cache open", c, with_cache);
  // The parent's cache is untouched: more steps, inserts and matches, then close.
  for (int seed = 2; seed < 6; seed++) insert_and_step(c, seed);
  cpcache_stats stats = {.struct_size = sizeof stats};
  expect_ok(cpcache_get_stats(c, &stats));
  expect_ok(cpcache_close(c));

  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", store);
  if (system(cmd) != 0) fprintf(stderr, "fork: could not remove %s\n", store);
  if (failures) {
    fprintf(stderr, "fork: %d failures\n", failures);
    return 1;
  }
  printf("fork: the parent's cache kept working after both children\n");
  return 0;
}
