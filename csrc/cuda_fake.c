/*
 * cuda_fake.c — a host-memory stand-in for libcuda.so.1, for tests only (never linked into
 * cpcache). Built by the cuda package's tests with gcc into a shared library and loaded
 * through CPCACHE_CUDA_LIBRARY, it lets the GPU tests exercise the Go binding end to end on a
 * machine without a GPU: one device; "device" memory is host memory (unified addresses).
 *
 * IPC works between processes of one user: every device allocation is a memfd mapped
 * MAP_SHARED, its handle carries the exporter's pid, the memfd's descriptor number and the
 * size, and cuIpcOpenMemHandle maps /proc/PID/fd/N (so the exporter must still hold the
 * allocation, as with a real driver). A process cannot open its own handle (as with CUDA).
 * Event handles open as fresh events, complete at once.
 *
 * Streams are lazy: async copies and memsets wait in their stream's queue until something
 * waits for them (cuStreamSynchronize, cuCtxSynchronize, an event recorded on the stream being
 * synchronized, queried or waited on by another stream that runs, an interprocess event's
 * record, the stream's destruction), so that a caller who trusts work it has not waited for
 * sees old bytes. An event captures its stream's work up to its record only: completing it
 * runs that much and not the work enqueued after it; cuStreamWaitEvent runs nothing on the
 * caller's thread (it queues the wait on the waiting stream).
 * CPCACHE_FAKE_CUDA_DEFER=0 runs the work when it is enqueued instead (for the NCCL fake,
 * whose collectives cannot see these queues). CPCACHE_FAKE_CUDA_COPY_FAIL_AT=N makes the Nth async copy
 * (counted from 1 in the process) fail with CUDA_ERROR_INVALID_VALUE, the copies before it
 * staying queued, as a real driver's would be in flight.
 *
 * It checks what the binding promises: every call that needs a context fails with
 * CUDA_ERROR_INVALID_CONTEXT (201) unless the device's primary context was made current on
 * the calling thread, and the batched copy checks its 12.8 attribute layout and that no copy
 * of a batch writes where another of it reads or writes (CUDA_ERROR_INVALID_VALUE, failIdx
 * naming it), and fails with CUDA_ERROR_NOT_SUPPORTED when CPCACHE_FAKE_CUDA_BATCH_FAIL=1, to
 * test the fallback.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static int primary_refs;          /* retains of the primary context */
static char fake_ctx;             /* its address is the CUcontext */
static __thread void *current;    /* the calling thread's current context */

#define NEED_CTX()                                              \
  do {                                                          \
    if (current != &fake_ctx || primary_refs <= 0) return 201;  \
  } while (0)

CUresult cuInit(unsigned int f) { return f == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
    case 0: *s = "CUDA_SUCCESS"; return 0;
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 600: *s = "CUDA_ERROR_NOT_READY"; return 0;
    case 801: *s = "CUDA_ERROR_NOT_SUPPORTED"; return 0;
  }
  return 1;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
  switch (e) {
    case 1: *s = "invalid argument"; return 0;
    case 101: *s = "invalid device ordinal"; return 0;
    case 201: *s = "invalid device context"; return 0;
    case 801: *s = "operation not supported"; return 0;
  }
  return cuGetErrorName(e, s);
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) {
  if (ordinal != 0) return 101;
  *d = 0;
  return 0;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
  if (dev != 0) return 101;
  snprintf(name, (size_t)len, "cpcache fake GPU");
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int dev) { (void)dev; *b = (size_t)16 << 30; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  switch (attr) {
    case 16: *v = 4; return 0;   /* SMs */
    case 41: *v = 1; return 0;   /* unified addressing */
    case 75: *v = 9; return 0;   /* cc major */
    case 76: *v = 0; return 0;   /* cc minor */
  }
  *v = 0;
  return 0;
}
CUresult cuDeviceGetPCIBusId(char *id, int len, int dev) {
  (void)dev;
  snprintf(id, (size_t)len, "0000:00:1F.7");
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  if (dev != 0) return 101;
  primary_refs++;
  *ctx = &fake_ctx;
  return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  (void)dev;
  if (primary_refs <= 0) return 201;
  primary_refs--;
  return 0;
}
CUresult cuCtxSetCurrent(void *ctx) {
  if (ctx != NULL && ctx != &fake_ctx) return 201;
  current = ctx;
  return 0;
}
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
static void queues_flush_all(void);
CUresult cuCtxSynchronize(void) { NEED_CTX(); queues_flush_all(); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  NEED_CTX();
  *t = (size_t)16 << 30;
  *f = *t / 2;
  return 0;
}
/* Device memory: memfd mappings, remembered so that cuMemFree can unmap them and
 * cuIpcGetMemHandle can name their descriptor; IPC mappings opened from peers likewise. */
typedef struct mapping {
  CUdeviceptr base;
  size_t size;
  int fd;       /* the memfd of an own allocation; -1 for a peer's mapping */
  struct mapping *next;
} mapping;
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps; /* protected by maps_mu */

static void maps_add(CUdeviceptr base, size_t size, int fd) {
  mapping *m = malloc(sizeof *m);
  m->base = base; m->size = size; m->fd = fd;
  pthread_mutex_lock(&maps_mu);
  m->next = maps;
  maps = m;
  pthread_mutex_unlock(&maps_mu);
}

/* maps_release removes the mapping at base (own: fd >= 0, or a peer's: fd < 0), unmaps it
 * and closes an own allocation's memfd; 1 (CUDA_ERROR_INVALID_VALUE) when there is none. */
static CUresult maps_release(CUdeviceptr base, int own) {
  mapping *m = NULL;
  pthread_mutex_lock(&maps_mu);
  for (mapping **pp = &maps; *pp; pp = &(*pp)->next) {
    if ((*pp)->base == base && ((*pp)->fd >= 0) == own) {
      m = *pp;
      *pp = m->next;
      break;
    }
  }
  pthread_mutex_unlock(&maps_mu);
  if (m == NULL) return 1;
  munmap((void *)(uintptr_t)m->base, m->size);
  if (m->fd >= 0) close(m->fd);
  free(m);
  return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  if (n == 0) return 1;
  int fd = memfd_create("cpcache-fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return 2;
  if (ftruncate(fd, (off_t)n) != 0) { close(fd); return 2; }
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) { close(fd); return 2; }
  *p = (CUdeviceptr)(uintptr_t)m;
  maps_add(*p, n, fd);
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CTX(); return maps_release(p, 1); }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
  NEED_CTX();
  if (flags & ~7u) return 1;
  *p = malloc(n);
  return *p ? 0 : 2;
}
CUresult cuMemFreeHost(void *p) { NEED_CTX(); free(p); return 0; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
  NEED_CTX();
  return (p == NULL || n == 0 || (flags & ~15u)) ? 1 : 0;
}
CUresult cuMemHostUnregister(void *p) { NEED_CTX(); return p ? 0 : 1; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int f) {
  NEED_CTX();
  if (f != 0) return 1;
  *d = (CUdeviceptr)(uintptr_t)p;
  return 0;
}
#define D(x) ((void *)(uintptr_t)(x))

/* Streams and their queues of deferred work. Every op a stream is given gets the stream's
 * next sequence number; an event records (stream id, last sequence number so far), so that
 * completing an event runs its stream's work up to the record and nothing after it, as a real
 * GPU would have done by then. A stream wait (cuStreamWaitEvent) is an op of the waiting
 * stream: when that stream runs it, it first runs the event's stream up to the record. */
enum { OP_COPY, OP_MEMSET, OP_WAIT };
typedef struct op {
  CUdeviceptr d, s; /* memset: s is the byte value; wait: s is the event's stream id */
  size_t n;         /* wait: the sequence number the event captured */
  int kind;
  long seq;         /* this op's sequence number in its stream */
  struct op *next;
} op;
typedef struct fstream {
  op *head, *tail;
  long id;                     /* unique in the process, never reused (events name streams by it) */
  long enqueued;               /* sequence number of the last op given to the stream */
  struct fstream *next, *prev; /* the live streams, for cuCtxSynchronize */
} fstream;
typedef struct {
  long st;          /* the id of the stream of its last record, or 0 */
  long seq;         /* that stream's last sequence number at the record */
  int interprocess; /* CU_EVENT_INTERPROCESS: recording it runs the stream's queue, since the
                       process that waits on it cannot */
} fevent;
static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static fstream streams; /* the list head of live streams; all queues are protected by q_mu */
static long stream_ids;   /* the last stream id given; protected by q_mu */
static long async_copies; /* async copies asked for so far, for COPY_FAIL_AT; protected by q_mu */

static int eager(void) {
  const char *v = getenv("CPCACHE_FAKE_CUDA_DEFER");
  return v != NULL && v[0] == '0';
}
static fstream *stream_by_id_locked(long id) {
  for (fstream *st = streams.next; st != NULL && st != &streams; st = st->next) {
    if (st->id == id) return st;
  }
  return NULL; /* destroyed: its work ran at the destroy */
}
static void flush_upto_locked(fstream *st, long seq);
static void op_run_locked(const op *o) {
  switch (o->kind) {
    case OP_MEMSET: memset(D(o->d), (int)o->s, o->n); break;
    case OP_COPY: memmove(D(o->d), D(o->s), o->n); break;
    case OP_WAIT: flush_upto_locked(stream_by_id_locked((long)o->s), (long)o->n); break;
  }
}
/* flush_upto_locked runs st's queued work in order, up to and including sequence number seq.
 * An op leaves the queue before it runs, so a wait that leads back to st runs only later ops
 * (a real GPU would deadlock on such a cycle). q_mu must be held. */
static void flush_upto_locked(fstream *st, long seq) {
  while (st != NULL && st->head != NULL && st->head->seq <= seq) {
    op *o = st->head;
    st->head = o->next;
    if (st->head == NULL) st->tail = NULL;
    op_run_locked(o);
    free(o);
  }
}
static void flush_locked(fstream *st) {
  if (st != NULL) flush_upto_locked(st, st->enqueued);
}
static void queue_flush(fstream *st) {
  pthread_mutex_lock(&q_mu);
  flush_locked(st);
  pthread_mutex_unlock(&q_mu);
}
static void queues_flush_all(void) {
  pthread_mutex_lock(&q_mu);
  for (fstream *st = streams.next; st != NULL && st != &streams; st = st->next) flush_locked(st);
  pthread_mutex_unlock(&q_mu);
}
/* enqueue_locked queues o on st, or runs it now (the NULL stream, eager mode). q_mu held. */
static void enqueue_locked(fstream *st, op o) {
  if (st == NULL || eager()) {
    flush_locked(st); /* stream order: earlier queued work first */
    op_run_locked(&o);
    return;
  }
  op *q = malloc(sizeof *q);
  *q = o;
  q->seq = ++st->enqueued;
  q->next = NULL;
  if (st->tail) st->tail->next = q;
  else st->head = q;
  st->tail = q;
}
/* enqueue queues the work on st, or runs it now (eager mode); a copy counts toward
 * COPY_FAIL_AT, whose copy fails (1) without being queued. */
static CUresult enqueue(void *stp, CUdeviceptr d, CUdeviceptr s, size_t n, int is_memset) {
  NEED_CTX();
  fstream *st = stp;
  op o = {d, s, n, is_memset ? OP_MEMSET : OP_COPY, 0, NULL};
  pthread_mutex_lock(&q_mu);
  if (!is_memset) {
    const char *at = getenv("CPCACHE_FAKE_CUDA_COPY_FAIL_AT");
    if (++async_copies == (at ? atol(at) : 0)) {
      pthread_mutex_unlock(&q_mu);
      return 1;
    }
  }
  enqueue_locked(st, o);
  pthread_mutex_unlock(&q_mu);
  return 0;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { NEED_CTX(); memmove(D(d), s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { NEED_CTX(); memmove(d, D(s), n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { NEED_CTX(); memmove(D(d), D(s), n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { return enqueue(st, d, (CUdeviceptr)(uintptr_t)s, n, 0); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { return enqueue(st, (CUdeviceptr)(uintptr_t)d, s, n, 0); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { return enqueue(st, d, s, n, 0); }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { return enqueue(st, d, s, n, 0); }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { NEED_CTX(); memset(D(d), v, n); return 0; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *st) { return enqueue(st, d, v, n, 1); }
CUresult cuStreamCreate(void **st, unsigned int flags) {
  NEED_CTX();
  if (flags > 1) return 1;
  fstream *s = calloc(1, sizeof *s);
  pthread_mutex_lock(&q_mu);
  s->id = ++stream_ids;
  if (streams.next == NULL) streams.next = streams.prev = &streams;
  s->next = streams.next;
  s->prev = &streams;
  streams.next->prev = s;
  streams.next = s;
  pthread_mutex_unlock(&q_mu);
  *st = s;
  return 0;
}
CUresult cuStreamDestroy_v2(void *stp) {
  NEED_CTX();
  fstream *s = stp;
  if (s == NULL) return 1;
  pthread_mutex_lock(&q_mu);
  flush_locked(s); /* like CUDA: the work enqueued before completes */
  s->prev->next = s->next;
  s->next->prev = s->prev;
  pthread_mutex_unlock(&q_mu);
  free(s);
  return 0;
}
CUresult cuStreamSynchronize(void *st) {
  NEED_CTX();
  if (!st) return 1;
  queue_flush(st);
  return 0;
}
/* A stream reports "not ready" on every other query, so pollers are exercised. */
static __thread int query_flip;
CUresult cuStreamQuery(void *st) {
  NEED_CTX();
  if (!st) return 1;
  if ((query_flip++ & 1) == 0) return 600;
  queue_flush(st);
  return 0;
}
/* event_flush runs the work ev captured (its stream's queue up to the record), if that stream
 * still lives (an event outlives its stream, as with CUDA; the destroy ran the stream's work). */
static void event_flush(void *ev) {
  fevent *e = ev;
  pthread_mutex_lock(&q_mu);
  flush_upto_locked(stream_by_id_locked(e->st), e->seq);
  pthread_mutex_unlock(&q_mu);
}
/* cuStreamWaitEvent queues a wait on st for the work ev captured now (a later record of ev
 * does not change it, as with CUDA); nothing runs on the calling thread, except on the NULL
 * (legacy default) stream, which the fake runs at once. */
CUresult cuStreamWaitEvent(void *st, void *ev, unsigned int f) {
  NEED_CTX();
  if (!ev || f != 0) return 1;
  fevent *e = ev;
  pthread_mutex_lock(&q_mu);
  op o = {0, (CUdeviceptr)e->st, (size_t)e->seq, OP_WAIT, 0, NULL};
  if (e->st != 0) enqueue_locked(st, o);
  pthread_mutex_unlock(&q_mu);
  return 0;
}
CUresult cuEventCreate(void **ev, unsigned int flags) {
  NEED_CTX();
  if (flags > 7) return 1;
  fevent *e = calloc(1, sizeof *e);
  e->interprocess = (flags & 4) != 0;
  *ev = e;
  return 0;
}
CUresult cuEventDestroy_v2(void *ev) { NEED_CTX(); free(ev); return 0; }
CUresult cuEventRecord(void *ev, void *st) {
  NEED_CTX();
  if (!ev || !st) return 1;
  fevent *e = ev;
  fstream *s = st;
  pthread_mutex_lock(&q_mu);
  e->st = s->id;
  e->seq = s->enqueued;
  if (e->interprocess) flush_locked(s);
  pthread_mutex_unlock(&q_mu);
  return 0;
}
CUresult cuEventSynchronize(void *ev) {
  NEED_CTX();
  if (!ev) return 1;
  event_flush(ev);
  return 0;
}
/* An event is complete once its work has run: querying it runs that work. */
CUresult cuEventQuery(void *ev) { return cuEventSynchronize(ev); }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { NEED_CTX(); *ms = (a && b) ? 0.5f : 0; return 0; }
typedef struct { char reserved[64]; } handle64;
/* The fake's IPC memory handle, inside the 64 opaque bytes. */
typedef struct { char magic[8]; int32_t pid, fd; uint64_t size; } fake_ipc;
static const char ipc_magic[8] = "cpfkipc";

CUresult cuIpcGetMemHandle(handle64 *h, CUdeviceptr p) {
  NEED_CTX();
  fake_ipc f = {0};
  pthread_mutex_lock(&maps_mu);
  for (mapping *m = maps; m; m = m->next) {
    if (m->base == p && m->fd >= 0) { f.fd = m->fd; f.size = m->size; }
  }
  pthread_mutex_unlock(&maps_mu);
  if (f.size == 0) return 1; /* not the base of an own allocation */
  memcpy(f.magic, ipc_magic, sizeof f.magic);
  f.pid = (int32_t)getpid();
  memset(h, 0, sizeof *h);
  memcpy(h, &f, sizeof f);
  return 0;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, handle64 h, unsigned int flags) {
  NEED_CTX();
  fake_ipc f;
  memcpy(&f, &h, sizeof f);
  if (memcmp(f.magic, ipc_magic, sizeof f.magic) != 0 || f.size == 0 || flags > 1) return 1;
  if (f.pid == (int32_t)getpid()) return 201; /* like CUDA: not in the exporting process */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)f.pid, (int)f.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return 1;
  void *m = mmap(NULL, f.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return 2;
  *p = (CUdeviceptr)(uintptr_t)m;
  maps_add(*p, f.size, -1);
  return 0;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEED_CTX(); return maps_release(p, 0); }
CUresult cuIpcGetEventHandle(handle64 *h, void *ev) {
  NEED_CTX();
  if (ev == NULL) return 1;
  memset(h, 0, sizeof *h);
  memcpy(h, ipc_magic, sizeof ipc_magic);
  return 0;
}
CUresult cuIpcOpenEventHandle(void **ev, handle64 h) {
  NEED_CTX();
  if (memcmp(&h, ipc_magic, sizeof ipc_magic) != 0) return 1;
  *ev = calloc(1, sizeof(fevent));
  return 0;
}

/* span is one side of a batch copy, for the overlap check. */
typedef struct { CUdeviceptr lo, hi; size_t idx; int dst; } span; /* [lo, hi) of copy idx */
static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}
/* batch_overlap returns the index of a copy whose span overlaps a destination (another copy's
 * or its own), or count when there is none: sorted by start, a span overlaps an earlier one
 * exactly when it starts before that one's end. */
static size_t batch_overlap(const CUdeviceptr *dsts, const CUdeviceptr *srcs, const size_t *sizes, size_t count) {
  span *sp = malloc(2 * count * sizeof *sp);
  if (sp == NULL) return count;
  for (size_t i = 0; i < count; i++) {
    sp[2 * i] = (span){dsts[i], dsts[i] + sizes[i], i, 1};
    sp[2 * i + 1] = (span){srcs[i], srcs[i] + sizes[i], i, 0};
  }
  qsort(sp, 2 * count, sizeof *sp, span_cmp);
  CUdeviceptr any_end = 0, dst_end = 0; /* the largest end so far, of any span and of a destination */
  size_t bad = count;
  for (size_t i = 0; i < 2 * count && bad == count; i++) {
    if ((sp[i].dst && sp[i].lo < any_end) || sp[i].lo < dst_end) bad = sp[i].idx;
    if (sp[i].hi > any_end) any_end = sp[i].hi;
    if (sp[i].dst && sp[i].hi > dst_end) dst_end = sp[i].hi;
  }
  free(sp);
  return bad;
}

/* The CUDA 12.8 batched copy: checks the attribute layout the binding sends. */
typedef struct { int type; int id; } loc;
typedef struct { int srcAccessOrder; loc srcLocHint; loc dstLocHint; unsigned int flags; } attrs;
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            attrs *a, size_t *idx, size_t nattrs, size_t *failIdx, void *st) {
  NEED_CTX();
  *failIdx = (size_t)-1;
  /* Failure injection for the binding's per-copy fallback. */
  const char *fail = getenv("CPCACHE_FAKE_CUDA_BATCH_FAIL");
  if (fail != NULL && fail[0] == '1') { *failIdx = 0; return 801; }
  if (st == NULL || nattrs != 1 || idx[0] != 0 || a[0].srcAccessOrder != 1 || a[0].flags != 0) return 1;
  for (size_t i = 0; i < count; i++) {
    if (sizes[i] == 0) { *failIdx = i; return 1; }
  }
  /* The copies of a batch may run in any order: none may write where another reads or writes. */
  size_t bad = batch_overlap(dsts, srcs, sizes, count);
  if (bad < count) { *failIdx = bad; return 1; }
  for (size_t i = 0; i < count; i++) {
    CUresult rc = enqueue(st, dsts[i], srcs[i], sizes[i], 0);
    if (rc != 0) { *failIdx = i; return rc; }
  }
  return 0;
}
