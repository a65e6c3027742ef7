// bench.c — per-call cost of the C ABI against the Go API, in one process: rounds of the
// same workload alternate between the C functions and cpcache_bench_go (the Go API on the
// same cache, in a library built with -tags cpcache_bench). One rank; each iteration inserts
// a 64-page sequence whose first 32 pages are shared, matches it, steps, and evicts its new
// pages (and steps, untimed, while more than 8 backups are in flight). Prints the best round of each side and the ratios C / Go. `make bench-capi`.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpcache.h"

int cpcache_bench_go(cpcache_t c, int first, int iters, int page_tokens, int pages, double *out);

enum { PT = 16, PAGES = 64, ITERS = 200, ROUNDS = 15 };

#define check(call)                                                                       \
  do {                                                                                    \
    if ((call) != CPCACHE_OK) {                                                           \
      fprintf(stderr, "bench: %s: %s\n", #call, cpcache_last_error());                    \
      exit(2);                                                                            \
    }                                                                                     \
  } while (0)

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

// c_round runs iterations first..first+ITERS through the C ABI; out as cpcache_bench_go's.
static void c_round(cpcache_t c, int first, double *out) {
  static int32_t tokens[PAGES * PT], slots[PAGES];
  static cpcache_fill_page fill[PAGES];
  memset(out, 0, 5 * sizeof *out);
  for (int i = first; i < first + ITERS; i++) {
    for (int k = 0; k < PAGES * PT; k++) tokens[k] = k < PAGES * PT / 2 ? k + 1 : i * 1000003 + k + 1;
    cpcache_insert_result ins;
    cpcache_match_result m;
    double t0 = now_ns();
    check(cpcache_insert(c, tokens, PAGES * PT, &ins, fill, PAGES));
    double t1 = now_ns();
    check(cpcache_match(c, tokens, PAGES * PT, &m, slots, PAGES));
    double t2 = now_ns();
    check(cpcache_step(c));
    double t3 = now_ns();
    out[0] += t1 - t0, out[1] += t2 - t1, out[2] += t3 - t2;
    out[3] += (double)ins.n_fill, out[4] += (double)m.device_pages;
    check(cpcache_evict_l1(c, PAGES / 2, NULL));
    check(cpcache_evict_l2(c, PAGES / 2, NULL));
    // Untimed: let backups catch up, so that L1 never fills with pages under I/O.
    for (int64_t pending = 0; cpcache_pending(c, &pending) == CPCACHE_OK && pending > 8;) check(cpcache_step(c));
  }
}

static void keep_best(double *best, const double *r) {
  double v[3] = {r[0] / r[3], r[1] / r[4], r[2] / ITERS};
  for (int k = 0; k < 3; k++)
    if (best[k] == 0 || v[k] < best[k]) best[k] = v[k];
}

int main(void) {
  char dir[] = "/tmp/cpcache-bench-XXXXXX", store[64];
  if (!mkdtemp(dir)) return 2;
  snprintf(store, sizeof store, "file://%s", dir);
  cpcache_config cfg;
  check(cpcache_config_init(&cfg));
  cfg.world = 1, cfg.rank = 0, cfg.store_url = store;
  cfg.page_tokens = PT, cfg.page_bytes = 64, cfg.l1_pages = 8192, cfg.l2_pages = 16384;
  cpcache_t c;
  check(cpcache_open(&cfg, &c));
  double cb[3] = {0}, gb[3] = {0}, r[5];
  int next = 0;
  // Rounds alternate which side goes first, so that neither always inherits the other's
  // garbage; round 0 warms up.
  for (int round = 0; round < ROUNDS; round++) {
    for (int side = 0; side < 2; side++) {
      if ((side + round) % 2 == 0) {
        c_round(c, next, r);
        if (round > 0) keep_best(cb, r);
      } else {
        check(cpcache_bench_go(c, next, ITERS, PT, PAGES, r));
        if (round > 0) keep_best(gb, r);
      }
      next += ITERS;
    }
  }
  printf("best of %d rounds × %d iterations (64-page sequences, 32 new pages each)\n", ROUNDS - 1, ITERS);
  printf("%-8s %14s %14s %12s\n", "", "insert ns/page", "match ns/page", "step ns/op");
  printf("%-8s %14.1f %14.1f %12.0f\n", "Go API", gb[0], gb[1], gb[2]);
  printf("%-8s %14.1f %14.1f %12.0f\n", "C ABI", cb[0], cb[1], cb[2]);
  printf("%-8s %14.3f %14.3f %12.3f\n", "C / Go", cb[0] / gb[0], cb[1] / gb[1], cb[2] / gb[2]);
  check(cpcache_close(c));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : 2;
}
