/*
 * nccl_fake.c — a host-memory stand-in for libnccl.so.2, for tests only (never linked into
 * cpcache). Built by the nccl package's tests and loaded through CPCACHE_NCCL_LIBRARY
 * together with csrc/cuda_fake.c, it runs one-rank communicators: collectives copy the send
 * buffer to the receive buffer (unified addresses are host addresses under the fake driver).
 *
 * It behaves like NCCL >= 2.18 where it matters to the binding: it validates the ncclConfig_t
 * prefix (size, magic, version) as NCCL does; non-blocking communicators report
 * ncclInProgress from initialisation, the first collective, group end, split and finalize,
 * and then stay in progress for a few ncclCommGetAsyncError polls; a communicator of more
 * than one rank never finishes initialising (its peers never come) until it is aborted.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} config_prefix;

typedef struct {
  int nranks, rank, blocking;
  int polls_left; /* > 0: still in progress for that many polls; < 0: forever */
  int used;       /* collectives issued so far */
} comm;

typedef struct { char internal[128]; } uid;

static __thread int group_depth;
static __thread comm *group_comm;

static int type_size(int t) {
  static const int sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return (t >= 0 && t < 10) ? sizes[t] : 0;
}

int ncclGetVersion(int *v) { *v = 21803; return 0; }
int ncclGetUniqueId(uid *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, "cpcache-fake-nccl", 17);
  return 0;
}
const char *ncclGetErrorString(int r) {
  switch (r) {
    case 0: return "no error";
    case 4: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case 5: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case 7: return "NCCL operation in progress";
  }
  return "unknown result code";
}
const char *ncclGetLastError(comm *c) { (void)c; return ""; }

static int init(comm **out, int nranks, uid id, int rank, int blocking) {
  if (nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.internal, "cpcache-fake-nccl", 17) != 0) return 4;
  comm *c = calloc(1, sizeof *c);
  c->nranks = nranks;
  c->rank = rank;
  c->blocking = blocking;
  *out = c;
  if (nranks > 1) {
    if (blocking) return 2; /* a blocking fake cannot wait for peers that never come */
    c->polls_left = -1;
    return 7;
  }
  if (!blocking) {
    c->polls_left = 3;
    return 7;
  }
  return 0;
}

int ncclCommInitRank(comm **c, int nranks, uid id, int rank) { return init(c, nranks, id, rank, 1); }

int ncclCommInitRankConfig(comm **c, int nranks, uid id, int rank, config_prefix *cfg) {
  int blocking = 1;
  if (cfg != NULL) {
    if (cfg->magic != 0xcafebeefu || cfg->version < 21400 || cfg->size < 20) return 4;
    blocking = cfg->blocking;
  }
  return init(c, nranks, id, rank, blocking);
}

int ncclCommGetAsyncError(comm *c, int *r) {
  if (c == NULL) return 4;
  if (c->polls_left == 0) {
    *r = 0;
  } else {
    if (c->polls_left > 0) c->polls_left--;
    *r = 7;
  }
  return 0;
}

static int ready(comm *c) { return c != NULL && c->polls_left == 0; }

/* in_progress marks a non-blocking communicator busy for two polls after an operation. */
static int in_progress(comm *c) {
  if (c->blocking) return 0;
  c->polls_left = 2;
  return 7;
}

int ncclCommCount(comm *c, int *n) { if (!ready(c)) return 5; *n = c->nranks; return 0; }
int ncclCommCuDevice(comm *c, int *d) { if (!ready(c)) return 5; *d = 0; return 0; }
int ncclCommUserRank(comm *c, int *r) { if (!ready(c)) return 5; *r = c->rank; return 0; }

static int collective(comm *c, const void *send, void *recv, size_t bytes) {
  if (!ready(c)) return 5;
  if (bytes > 0 && (send == NULL || recv == NULL)) return 4;
  memmove(recv, send, bytes);
  c->used++;
  if (group_depth > 0) {
    group_comm = c;
    return 0;
  }
  return c->used == 1 ? in_progress(c) : 0;
}

int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0 || op < 0 || op > 4) return 4;
  return collective(c, s, r, n * (size_t)type_size(t));
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0 || c == NULL || root < 0 || root >= c->nranks) return 4;
  return collective(c, s, r, n * (size_t)type_size(t));
}
int ncclAllGather(const void *s, void *r, size_t n, int t, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0) return 4;
  return collective(c, s, r, n * (size_t)type_size(t));
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0 || op < 0 || op > 4) return 4;
  return collective(c, s, r, n * (size_t)type_size(t));
}
int ncclGroupStart(void) { group_depth++; return 0; }
int ncclGroupEnd(void) {
  if (group_depth <= 0) return 5;
  if (--group_depth == 0 && group_comm != NULL) {
    comm *c = group_comm;
    group_comm = NULL;
    return in_progress(c);
  }
  return 0;
}
int ncclCommSplit(comm *c, int color, int key, comm **out, config_prefix *cfg) {
  (void)key;
  if (!ready(c)) return 5;
  if (cfg != NULL && (cfg->magic != 0xcafebeefu || cfg->version < 21400 || cfg->size < 20)) return 4;
  if (color == -1) {
    *out = NULL;
    return in_progress(c);
  }
  comm *n = calloc(1, sizeof *n);
  n->nranks = 1;
  n->blocking = cfg != NULL ? cfg->blocking : c->blocking;
  *out = n;
  return in_progress(n);
}
int ncclCommFinalize(comm *c) { if (!ready(c)) return 5; return in_progress(c); }
int ncclCommDestroy(comm *c) { if (c == NULL) return 4; if (c->polls_left != 0) return 5; free(c); return 0; }
int ncclCommAbort(comm *c) { free(c); return 0; }
