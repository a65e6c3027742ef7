// reopen.c — opens and closes a cache many times in a row on one rendezvous store: every
// open is a new run of the same job in the store's key space, and a rank of run k+1 may
// read the store while another rank still closes run k (so reads and replacements of the
// run's keys overlap). Each iteration also makes one step (a collective of the replica
// group) and checks the agreed step count, so a rank that joined another run's world would
// fail there.
//
// Every rank of the job runs it (cpcache launch -n 4 -- reopen 200): one CP group of the
// whole world, the rank and the store from the launcher's environment.
// Usage: reopen N. Exit status 0 when every open, step and close succeeded; 2 otherwise,
// naming the iteration.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpcache.h"

int main(int argc, char **argv) {
  if (argc != 2 || atoi(argv[1]) < 1) {
    fprintf(stderr, "usage: reopen N (N >= 1 opens)\n");
    return 2;
  }
  int n = atoi(argv[1]);
  const char *world_env = getenv("WORLD_SIZE");
  int world = world_env ? atoi(world_env) : 1;
  for (int i = 0; i < n; i++) {
    cpcache_config cfg;
    cpcache_t c = 0;
    int rc = cpcache_config_init(&cfg);
    cfg.attn_cp = world;
    cfg.page_tokens = 4;
    cfg.page_bytes = 64;
    cfg.l1_pages = 4;
    cfg.l2_pages = 4;
    cfg.timeout_ms = 30000;
    if (rc == CPCACHE_OK) rc = cpcache_open(&cfg, &c);
    if (rc != CPCACHE_OK) {
      fprintf(stderr, "reopen: open %d of %d: status %d: %s\n", i + 1, n, rc, cpcache_last_error());
      return 2;
    }
    cpcache_stats st = {.struct_size = sizeof st};
    rc = cpcache_step(c);
    if (rc == CPCACHE_OK) rc = cpcache_get_stats(c, &st);
    if (rc == CPCACHE_OK && st.steps != 1) {
      fprintf(stderr, "reopen: open %d of %d: %lld steps after one step\n", i + 1, n, (long long)st.steps);
      return 2;
    }
    if (rc != CPCACHE_OK) {
      fprintf(stderr, "reopen: open %d of %d: step: status %d: %s\n", i + 1, n, rc, cpcache_last_error());
      return 2;
    }
    rc = cpcache_close(c);
    if (rc != CPCACHE_OK) {
      fprintf(stderr, "reopen: close %d of %d: status %d: %s\n", i + 1, n, rc, cpcache_last_error());
      return 2;
    }
  }
  printf("reopen: %d opens and closes\n", n);
  return 0;
}
