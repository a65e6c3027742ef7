/*
 * cuda_fake.c — a host-memory stand-in for libcuda.so.1, for tests only (never linked into
 * cpcache). Built by the cuda package's tests with gcc into a shared library and loaded
 * through CPCACHE_CUDA_LIBRARY, it lets the GPU tests exercise the Go binding end to end on a
 * machine without a GPU: one device; "device" memory is host memory (unified addresses);
 * streams run copies immediately; IPC is not supported.
 *
 * It checks what the binding promises: every call that needs a context fails with
 * CUDA_ERROR_INVALID_CONTEXT (201) unless the device's primary context was made current on
 * the calling thread, and the batched copy checks its 12.8 attribute layout.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 600: *s = "CUDA_ERROR_NOT_READY"; return 0;
    case 801: *s = "CUDA_ERROR_NOT_SUPPORTED"; return 0;
  }
  return 1;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
  switch (e) {
    case 1: *s = "invalid argument"; return 0;
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
CUresult cuCtxSynchronize(void) { NEED_CTX(); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  NEED_CTX();
  *t = (size_t)16 << 30;
  *f = *t / 2;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  void *m = malloc(n);
  if (m == NULL) return 2;
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CTX(); free((void *)(uintptr_t)p); return 0; }
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
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { NEED_CTX(); memmove(D(d), s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { NEED_CTX(); memmove(d, D(s), n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { NEED_CTX(); memmove(D(d), D(s), n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { (void)st; return cuMemcpyHtoD_v2(d, s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoH_v2(d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoD_v2(d, s, n); }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoD_v2(d, s, n); }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { NEED_CTX(); memset(D(d), v, n); return 0; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *st) { (void)st; return cuMemsetD8_v2(d, v, n); }
CUresult cuStreamCreate(void **st, unsigned int flags) {
  NEED_CTX();
  if (flags > 1) return 1;
  *st = malloc(1);
  return 0;
}
CUresult cuStreamDestroy_v2(void *st) { NEED_CTX(); free(st); return 0; }
CUresult cuStreamSynchronize(void *st) { NEED_CTX(); return st ? 0 : 1; }
/* A stream reports "not ready" on every other query, so pollers are exercised. */
static __thread int query_flip;
CUresult cuStreamQuery(void *st) {
  NEED_CTX();
  if (!st) return 1;
  return (query_flip++ & 1) ? 0 : 600;
}
CUresult cuStreamWaitEvent(void *st, void *ev, unsigned int f) { NEED_CTX(); return (st && ev && f == 0) ? 0 : 1; }
CUresult cuEventCreate(void **ev, unsigned int flags) {
  NEED_CTX();
  if (flags > 7) return 1;
  *ev = malloc(1);
  return 0;
}
CUresult cuEventDestroy_v2(void *ev) { NEED_CTX(); free(ev); return 0; }
CUresult cuEventRecord(void *ev, void *st) { NEED_CTX(); return (ev && st) ? 0 : 1; }
CUresult cuEventSynchronize(void *ev) { NEED_CTX(); return ev ? 0 : 1; }
CUresult cuEventQuery(void *ev) { NEED_CTX(); return ev ? 0 : 1; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { NEED_CTX(); *ms = (a && b) ? 0.5f : 0; return 0; }
CUresult cuIpcGetMemHandle(void *h, CUdeviceptr p) { (void)h; (void)p; NEED_CTX(); return 801; }
typedef struct { char reserved[64]; } handle64;
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, handle64 h, unsigned int f) { (void)p; (void)h; (void)f; NEED_CTX(); return 801; }
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { (void)p; NEED_CTX(); return 801; }
CUresult cuIpcGetEventHandle(void *h, void *ev) { (void)h; (void)ev; NEED_CTX(); return 801; }
CUresult cuIpcOpenEventHandle(void **ev, handle64 h) { (void)ev; (void)h; NEED_CTX(); return 801; }

/* The CUDA 12.8 batched copy: checks the attribute layout the binding sends. */
typedef struct { int type; int id; } loc;
typedef struct { int srcAccessOrder; loc srcLocHint; loc dstLocHint; unsigned int flags; } attrs;
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            attrs *a, size_t *idx, size_t nattrs, size_t *failIdx, void *st) {
  NEED_CTX();
  *failIdx = (size_t)-1;
  if (st == NULL || nattrs != 1 || idx[0] != 0 || a[0].srcAccessOrder != 1 || a[0].flags != 0) return 1;
  for (size_t i = 0; i < count; i++) {
    if (sizes[i] == 0) { *failIdx = i; return 1; }
    memmove(D(dsts[i]), D(srcs[i]), sizes[i]);
  }
  return 0;
}
