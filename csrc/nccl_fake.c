/*
 * nccl_fake.c — a host-memory stand-in for libnccl.so.2, for tests only (never linked into
 * cpcache). Built by the nccl package's tests and loaded through CPCACHE_NCCL_LIBRARY
 * together with csrc/cuda_fake.c, it runs one-rank communicators: collectives copy the send
 * buffer to the receive buffer (unified addresses are host addresses under the fake driver).
 *
 * It behaves like NCCL >= 2.18 (checked against 2.28's src/init.cc and src/group.cc) where it
 * matters to the binding:
 *  - it validates the ncclConfig_t prefix (size, magic, version) as NCCL does;
 *  - non-blocking communicators report ncclInProgress from initialisation, the first
 *    collective, group end and finalize, and then stay in progress for a few
 *    ncclCommGetAsyncError polls; a communicator of more than one rank never finishes
 *    initialising (its peers never come) until it is aborted;
 *  - using a communicator whose last operation is still in progress fails with
 *    ncclInvalidArgument ("Attempt to use communicator before the previous operation returned
 *    ncclSuccess", NCCL's ncclCommEnsureReady);
 *  - ncclCommSplit on a non-blocking parent returns ncclSuccess with *newcomm = NULL, leaves
 *    the PARENT in progress, and stores the child into *newcomm only when the split completes
 *    (NCCL's job thread does __atomic_store_n(job->newcomm, comm) at the end of
 *    ncclCommInitRankFunc), which here is the poll of the parent that reports ncclSuccess;
 *  - group state is per thread; ncclCommDestroy of a communicator that is not ready returns
 *    ncclInvalidArgument WITHOUT leaving its internal group (2.28 does NCCLCHECK(
 *    ncclCommEnsureReady(comm)) after ncclGroupStartInternal), so that thread's later calls
 *    run inside a group: ncclCommInitRank there returns ncclSuccess with an uninitialised
 *    communicator of 0 ranks, and a non-blocking init there fails with "Blocking and
 *    nonblocking communicators are not allowed in the same group". Because Go reuses OS
 *    threads at random, the fake also latches such a leak process-wide (every later call
 *    fails with ncclInvalidUsage) so that a test catches it deterministically;
 *  - every call on a communicator needs a CUDA context current on the calling thread (NCCL
 *    >= 2.19 checks the device of the calling thread in ncclCommGetAsyncError, the queries
 *    and abort): with the fake libcuda loaded (CPCACHE_CUDA_LIBRARY) it asks that library's
 *    cuCtxGetCurrent and fails with ncclUnhandledCudaError when none is current.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} config_prefix;

typedef struct comm comm;
struct comm {
  int nranks, rank, blocking;
  int polls_left;      /* > 0: still in progress for that many polls; < 0: forever */
  int used;            /* collectives issued so far */
  comm *pending_child; /* split in progress: the child, published at completion */
  comm **pending_out;  /* where the split publishes it (the caller's newcomm) */
  int pending_split;   /* a split (with or without a child) is in progress */
};

typedef struct { char internal[128]; } uid;

static __thread int group_depth;
static __thread int group_blocking = -1; /* blocking mode of the comms in this thread's group */
static __thread comm *group_comm;
static int leaked; /* a thread was left inside a group by a failed ncclCommDestroy */
static __thread char last_error[256];

static int fail(int code, const char *msg) {
  snprintf(last_error, sizeof last_error, "%s", msg);
  return code;
}
#define LEAK_CHECK() \
  if (__atomic_load_n(&leaked, __ATOMIC_ACQUIRE)) \
    return fail(5, "fake: an earlier ncclCommDestroy of a busy communicator left a thread inside a group")

/* need_ctx: 0 when a CUDA context is current on this thread (or no fake libcuda to ask). */
typedef int (*get_current_fn)(void **);
static get_current_fn cuda_get_current(void) {
  static get_current_fn fn;
  static int looked;
  if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
    const char *path = getenv("CPCACHE_CUDA_LIBRARY");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    get_current_fn f = h ? (get_current_fn)dlsym(h, "cuCtxGetCurrent") : NULL;
    __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
  }
  return __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
}
static int need_ctx(const char *call) {
  get_current_fn f = cuda_get_current();
  void *ctx = NULL;
  if (f != NULL && (f(&ctx) != 0 || ctx == NULL)) {
    snprintf(last_error, sizeof last_error, "fake: %s without a current CUDA context", call);
    return 1;
  }
  return 0;
}
#define NEED_CTX(call) \
  if (need_ctx(call)) return 1

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
    case 2: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case 4: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case 5: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case 1: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case 7: return "NCCL operation in progress";
  }
  return "unknown result code";
}
const char *ncclGetLastError(comm *c) { (void)c; return last_error; }

/* ensure_ready is NCCL's ncclCommEnsureReady: a communicator is usable only once its last
 * operation has been seen to complete through ncclCommGetAsyncError. */
static int ensure_ready(comm *c) {
  if (c == NULL) return fail(4, "fake: NULL communicator");
  if (c->polls_left != 0 || c->pending_split)
    return fail(4, "Attempt to use communicator before the previous operation returned ncclSuccess");
  return 0;
}

/* group_join is NCCL's check in ncclAsyncLaunch / taskAppend. */
static int group_join(comm *c) {
  if (group_blocking == -1) {
    group_blocking = c->blocking;
  } else if (group_blocking != c->blocking) {
    return fail(4, "Blocking and nonblocking communicators are not allowed in the same group.");
  }
  return 0;
}

static int init(comm **out, int nranks, uid id, int rank, int blocking) {
  LEAK_CHECK();
  if (nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.internal, "cpcache-fake-nccl", 17) != 0)
    return fail(4, "fake: bad init arguments");
  comm *c = calloc(1, sizeof *c);
  c->blocking = blocking;
  *out = c;
  if (group_depth > 0) {
    /* Inside a group the init is deferred to ncclGroupEnd: the communicator is returned
     * uninitialised (0 ranks), as NCCL does. */
    if (group_join(c) != 0) return 4;
    return 0;
  }
  c->nranks = nranks;
  c->rank = rank;
  if (nranks > 1) {
    if (blocking) return fail(2, "fake: a blocking init cannot wait for peers that never come");
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
    if (cfg->magic != 0xcafebeefu || cfg->version < 21400 || cfg->size < 20)
      return fail(4, "fake: bad ncclConfig_t (magic, version or size)");
    blocking = cfg->blocking;
  }
  return init(c, nranks, id, rank, blocking);
}

int ncclCommGetAsyncError(comm *c, int *r) {
  if (c == NULL || r == NULL) return 4;
  NEED_CTX("ncclCommGetAsyncError");
  if (c->polls_left == 0) {
    *r = 0;
  } else {
    if (c->polls_left > 0) c->polls_left--;
    *r = 7;
    return 0;
  }
  if (c->pending_split) { /* the split job completed: publish the child, as NCCL's job thread does */
    c->pending_split = 0;
    if (c->pending_out != NULL) __atomic_store_n(c->pending_out, c->pending_child, __ATOMIC_RELEASE);
    c->pending_child = NULL;
    c->pending_out = NULL;
  }
  return 0;
}

/* in_progress marks a non-blocking communicator busy for two polls after an operation. */
static int in_progress(comm *c) {
  if (c->blocking) return 0;
  c->polls_left = 2;
  return 7;
}

int ncclCommCount(comm *c, int *n) { LEAK_CHECK(); NEED_CTX("ncclCommCount"); if (ensure_ready(c)) return 4; *n = c->nranks; return 0; }
int ncclCommCuDevice(comm *c, int *d) { LEAK_CHECK(); NEED_CTX("ncclCommCuDevice"); if (ensure_ready(c)) return 4; *d = 0; return 0; }
int ncclCommUserRank(comm *c, int *r) { LEAK_CHECK(); NEED_CTX("ncclCommUserRank"); if (ensure_ready(c)) return 4; *r = c->rank; return 0; }

static int collective(comm *c, const void *send, void *recv, size_t bytes, int root) {
  LEAK_CHECK();
  if (ensure_ready(c)) return 4;
  if (root < 0 || root >= c->nranks) return fail(4, "fake: invalid root (root should be in the 0..nRanks range)");
  if (bytes > 0 && (send == NULL || recv == NULL)) return fail(4, "fake: NULL buffer");
  if (group_depth > 0 && group_join(c) != 0) return 4;
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
  if (type_size(t) == 0 || op < 0 || op > 4) return fail(4, "fake: bad type or op");
  return collective(c, s, r, n * (size_t)type_size(t), 0);
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0) return fail(4, "fake: bad type");
  return collective(c, s, r, n * (size_t)type_size(t), root);
}
int ncclAllGather(const void *s, void *r, size_t n, int t, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0) return fail(4, "fake: bad type");
  return collective(c, s, r, n * (size_t)type_size(t), 0);
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
  (void)st;
  if (type_size(t) == 0 || op < 0 || op > 4) return fail(4, "fake: bad type or op");
  return collective(c, s, r, n * (size_t)type_size(t), 0);
}
int ncclGroupStart(void) { LEAK_CHECK(); group_depth++; return 0; }
int ncclGroupEnd(void) {
  if (group_depth <= 0) return fail(5, "ncclGroupEnd: not in a group call.");
  if (--group_depth == 0) {
    group_blocking = -1;
    if (group_comm != NULL) {
      comm *c = group_comm;
      group_comm = NULL;
      return in_progress(c);
    }
  }
  return 0;
}
int ncclCommSplit(comm *c, int color, int key, comm **out, config_prefix *cfg) {
  (void)key;
  LEAK_CHECK();
  if (out == NULL) return fail(4, "CommSplit : newcomm argument is NULL");
  if (ensure_ready(c)) return 4;
  if (cfg != NULL && (cfg->magic != 0xcafebeefu || cfg->version < 21400 || cfg->size < 20))
    return fail(4, "fake: bad ncclConfig_t (magic, version or size)");
  *out = NULL; /* NCCL: "*newcomm should be NCCL_COMM_NULL until comm split fully complete" */
  comm *n = NULL;
  if (color != -1) {
    n = calloc(1, sizeof *n);
    n->nranks = 1;
    n->blocking = cfg != NULL ? cfg->blocking : c->blocking;
  }
  if (c->blocking) {
    *out = n;
    return 0;
  }
  /* Non-blocking: ncclGroupEndInternal marks the parent in progress and the split returns
   * ncclSuccess (NCCLCHECK lets ncclInProgress through; ncclCommSplit returns res). */
  c->pending_split = 1;
  c->pending_child = n;
  c->pending_out = out;
  c->polls_left = 2;
  return 0;
}
int ncclCommFinalize(comm *c) {
  LEAK_CHECK();
  if (ensure_ready(c)) return 4;
  return in_progress(c);
}
int ncclCommDestroy(comm *c) {
  LEAK_CHECK();
  if (c == NULL) return 0;
  group_depth++; /* ncclGroupStartInternal */
  if (ensure_ready(c)) {
    /* NCCL 2.28 returns here without ncclGroupEndInternal: this thread stays in a group. */
    __atomic_store_n(&leaked, 1, __ATOMIC_RELEASE);
    return 4;
  }
  group_depth--;
  free(c);
  return 0;
}
int ncclCommAbort(comm *c) {
  if (c == NULL) return 0;
  NEED_CTX("ncclCommAbort");
  if (c->pending_split && c->pending_out != NULL) {
    /* the aborted split job still finishes (and publishes NULL) before abort returns */
    __atomic_store_n(c->pending_out, NULL, __ATOMIC_RELEASE);
    free(c->pending_child);
  }
  free(c);
  return 0;
}
