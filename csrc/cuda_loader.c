/*
 * cuda_loader.c — loads libcuda.so.1 at run time and exposes thin call trampolines for Go.
 * See cuda_api.h for the ABI notes and the threading rule (context made current per call).
 */
#include "cuda_api.h"
#include "loader.h"

static cp_lib cp_cuda_lib = CP_LIB_INIT;
static cp_cuda_table cp_cu; /* filled while cp_cuda_lib.mu is held; read after a successful open */

#define CP_CUDA_SPEC(name, since, opt, ret, params) {#name, "CUDA " since, opt, offsetof(cp_cuda_table, name)},
static const cp_sym_spec cp_cuda_specs[] = {CP_CUDA_FUNCS(CP_CUDA_SPEC)};
#undef CP_CUDA_SPEC
#define CP_CUDA_NSPECS ((int)(sizeof cp_cuda_specs / sizeof cp_cuda_specs[0]))

int cp_cuda_open(const char *const *candidates, int n, char *err, size_t cap) {
  pthread_mutex_lock(&cp_cuda_lib.mu);
  int rc = cp_lib_open_locked(&cp_cuda_lib, candidates, n, cp_cuda_specs, CP_CUDA_NSPECS, &cp_cu,
                              sizeof cp_cu, err, cap);
  pthread_mutex_unlock(&cp_cuda_lib.mu);
  return rc;
}

int cp_cuda_close(void) {
  pthread_mutex_lock(&cp_cuda_lib.mu);
  int left = cp_lib_close_locked(&cp_cuda_lib);
  if (cp_cuda_lib.handle == NULL) memset(&cp_cu, 0, sizeof cp_cu);
  pthread_mutex_unlock(&cp_cuda_lib.mu);
  return left;
}

void cp_cuda_keep(void) {
  pthread_mutex_lock(&cp_cuda_lib.mu);
  cp_cuda_lib.keep = 1;
  pthread_mutex_unlock(&cp_cuda_lib.mu);
}

int cp_cuda_path(char *out, size_t cap) {
  pthread_mutex_lock(&cp_cuda_lib.mu);
  int loaded = cp_cuda_lib.handle != NULL;
  snprintf(out, cap, "%s", cp_cuda_lib.path);
  pthread_mutex_unlock(&cp_cuda_lib.mu);
  return loaded;
}

int cp_cuda_symbol_count(void) { return CP_CUDA_NSPECS; }

int cp_cuda_symbol(int i, const char **name, const char **since, int *optional) {
  if (i < 0 || i >= CP_CUDA_NSPECS) return -1;
  *name = cp_cuda_specs[i].name;
  *since = cp_cuda_specs[i].since;
  *optional = cp_cuda_specs[i].optional;
  return 0;
}

int cp_cuda_batch_abi(void) {
  if (cp_cu.cuMemcpyBatchAsync != NULL) return 1;
  if (cp_cu.cuMemcpyBatchAsync_v2 != NULL) return 2;
  return 0;
}

#define CP_NEED(fn) \
  if (cp_cu.fn == NULL) return CP_NOT_LOADED
#define CP_CTX(ctx)                                                  \
  do {                                                               \
    if ((ctx) != NULL) {                                             \
      int r_ = cp_cu.cuCtxSetCurrent((cp_CUcontext)(ctx));           \
      if (r_ != CP_CUDA_SUCCESS) return r_ | CP_CTX_FAILED;          \
    }                                                                \
  } while (0)

int cp_cuInit(unsigned int flags) {
  CP_NEED(cuInit);
  return cp_cu.cuInit(flags);
}
int cp_cuDriverGetVersion(int *v) {
  CP_NEED(cuDriverGetVersion);
  return cp_cu.cuDriverGetVersion(v);
}
const char *cp_cuErrorString(int code) {
  const char *s = NULL;
  if (cp_cu.cuGetErrorString == NULL || cp_cu.cuGetErrorString(code, &s) != CP_CUDA_SUCCESS) return NULL;
  return s;
}
const char *cp_cuErrorName(int code) {
  const char *s = NULL;
  if (cp_cu.cuGetErrorName == NULL || cp_cu.cuGetErrorName(code, &s) != CP_CUDA_SUCCESS) return NULL;
  return s;
}
int cp_cuDeviceGetCount(int *n) {
  CP_NEED(cuDeviceGetCount);
  return cp_cu.cuDeviceGetCount(n);
}
int cp_cuDeviceGet(int *dev, int ordinal) {
  CP_NEED(cuDeviceGet);
  return cp_cu.cuDeviceGet(dev, ordinal);
}
int cp_cuDeviceGetName(char *name, int len, int dev) {
  CP_NEED(cuDeviceGetName);
  return cp_cu.cuDeviceGetName(name, len, dev);
}
int cp_cuDeviceTotalMem(size_t *bytes, int dev) {
  CP_NEED(cuDeviceTotalMem_v2);
  return cp_cu.cuDeviceTotalMem_v2(bytes, dev);
}
int cp_cuDeviceGetAttribute(int *v, int attr, int dev) {
  CP_NEED(cuDeviceGetAttribute);
  return cp_cu.cuDeviceGetAttribute(v, attr, dev);
}
int cp_cuDeviceGetPCIBusId(char *id, int len, int dev) {
  CP_NEED(cuDeviceGetPCIBusId);
  return cp_cu.cuDeviceGetPCIBusId(id, len, dev);
}
int cp_cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  CP_NEED(cuDevicePrimaryCtxRetain);
  return cp_cu.cuDevicePrimaryCtxRetain((cp_CUcontext *)ctx, dev);
}
int cp_cuDevicePrimaryCtxRelease(int dev) {
  CP_NEED(cuDevicePrimaryCtxRelease_v2);
  return cp_cu.cuDevicePrimaryCtxRelease_v2(dev);
}
int cp_cuCtxSetCurrent(void *ctx) {
  CP_NEED(cuCtxSetCurrent);
  return cp_cu.cuCtxSetCurrent((cp_CUcontext)ctx);
}
int cp_cuCtxSynchronize(void *ctx) {
  CP_NEED(cuCtxSynchronize);
  CP_CTX(ctx);
  return cp_cu.cuCtxSynchronize();
}
int cp_cuMemGetInfo(void *ctx, size_t *free, size_t *total) {
  CP_NEED(cuMemGetInfo_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemGetInfo_v2(free, total);
}
int cp_cuMemAlloc(void *ctx, cp_CUdeviceptr *p, size_t n) {
  CP_NEED(cuMemAlloc_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemAlloc_v2(p, n);
}
int cp_cuMemFree(void *ctx, cp_CUdeviceptr p) {
  CP_NEED(cuMemFree_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemFree_v2(p);
}
int cp_cuMemHostAlloc(void *ctx, void **p, size_t n, unsigned int flags) {
  CP_NEED(cuMemHostAlloc);
  CP_CTX(ctx);
  return cp_cu.cuMemHostAlloc(p, n, flags);
}
int cp_cuMemFreeHost(void *ctx, void *p) {
  CP_NEED(cuMemFreeHost);
  CP_CTX(ctx);
  return cp_cu.cuMemFreeHost(p);
}
int cp_cuMemHostRegister(void *ctx, uintptr_t p, size_t n, unsigned int flags) {
  CP_NEED(cuMemHostRegister_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemHostRegister_v2((void *)p, n, flags);
}
int cp_cuMemHostUnregister(void *ctx, uintptr_t p) {
  CP_NEED(cuMemHostUnregister);
  CP_CTX(ctx);
  return cp_cu.cuMemHostUnregister((void *)p);
}
int cp_cuMemHostGetDevicePointer(void *ctx, cp_CUdeviceptr *d, uintptr_t p) {
  CP_NEED(cuMemHostGetDevicePointer_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemHostGetDevicePointer_v2(d, (void *)p, 0);
}
int cp_cuMemcpyHtoD(void *ctx, cp_CUdeviceptr d, const void *s, size_t n) {
  CP_NEED(cuMemcpyHtoD_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyHtoD_v2(d, s, n);
}
int cp_cuMemcpyDtoH(void *ctx, void *d, cp_CUdeviceptr s, size_t n) {
  CP_NEED(cuMemcpyDtoH_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyDtoH_v2(d, s, n);
}
int cp_cuMemcpyDtoD(void *ctx, cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n) {
  CP_NEED(cuMemcpyDtoD_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyDtoD_v2(d, s, n);
}
int cp_cuMemcpyHtoDAsync(void *ctx, cp_CUdeviceptr d, const void *s, size_t n, void *st) {
  CP_NEED(cuMemcpyHtoDAsync_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyHtoDAsync_v2(d, s, n, (cp_CUstream)st);
}
int cp_cuMemcpyDtoHAsync(void *ctx, void *d, cp_CUdeviceptr s, size_t n, void *st) {
  CP_NEED(cuMemcpyDtoHAsync_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyDtoHAsync_v2(d, s, n, (cp_CUstream)st);
}
int cp_cuMemcpyDtoDAsync(void *ctx, cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n, void *st) {
  CP_NEED(cuMemcpyDtoDAsync_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyDtoDAsync_v2(d, s, n, (cp_CUstream)st);
}
int cp_cuMemcpyAsync(void *ctx, cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n, void *st) {
  CP_NEED(cuMemcpyAsync);
  CP_CTX(ctx);
  return cp_cu.cuMemcpyAsync(d, s, n, (cp_CUstream)st);
}
int cp_cuMemsetD8(void *ctx, cp_CUdeviceptr d, unsigned char v, size_t n) {
  CP_NEED(cuMemsetD8_v2);
  CP_CTX(ctx);
  return cp_cu.cuMemsetD8_v2(d, v, n);
}
int cp_cuMemsetD8Async(void *ctx, cp_CUdeviceptr d, unsigned char v, size_t n, void *st) {
  CP_NEED(cuMemsetD8Async);
  CP_CTX(ctx);
  return cp_cu.cuMemsetD8Async(d, v, n, (cp_CUstream)st);
}
int cp_cuStreamCreate(void *ctx, void **st, unsigned int flags) {
  CP_NEED(cuStreamCreate);
  CP_CTX(ctx);
  return cp_cu.cuStreamCreate((cp_CUstream *)st, flags);
}
int cp_cuStreamDestroy(void *ctx, void *st) {
  CP_NEED(cuStreamDestroy_v2);
  CP_CTX(ctx);
  return cp_cu.cuStreamDestroy_v2((cp_CUstream)st);
}
int cp_cuStreamSynchronize(void *ctx, void *st) {
  CP_NEED(cuStreamSynchronize);
  CP_CTX(ctx);
  return cp_cu.cuStreamSynchronize((cp_CUstream)st);
}
int cp_cuStreamQuery(void *ctx, void *st) {
  CP_NEED(cuStreamQuery);
  CP_CTX(ctx);
  return cp_cu.cuStreamQuery((cp_CUstream)st);
}
int cp_cuStreamWaitEvent(void *ctx, void *st, void *ev) {
  CP_NEED(cuStreamWaitEvent);
  CP_CTX(ctx);
  return cp_cu.cuStreamWaitEvent((cp_CUstream)st, (cp_CUevent)ev, 0);
}
int cp_cuStreamWaitEventRaw(void *ctx, uintptr_t st, void *ev) {
  CP_NEED(cuStreamWaitEvent);
  CP_CTX(ctx);
  return cp_cu.cuStreamWaitEvent((cp_CUstream)st, (cp_CUevent)ev, 0);
}
int cp_cuEventCreate(void *ctx, void **ev, unsigned int flags) {
  CP_NEED(cuEventCreate);
  CP_CTX(ctx);
  return cp_cu.cuEventCreate((cp_CUevent *)ev, flags);
}
int cp_cuEventDestroy(void *ctx, void *ev) {
  CP_NEED(cuEventDestroy_v2);
  CP_CTX(ctx);
  return cp_cu.cuEventDestroy_v2((cp_CUevent)ev);
}
int cp_cuEventRecord(void *ctx, void *ev, void *st) {
  CP_NEED(cuEventRecord);
  CP_CTX(ctx);
  return cp_cu.cuEventRecord((cp_CUevent)ev, (cp_CUstream)st);
}
int cp_cuEventSynchronize(void *ctx, void *ev) {
  CP_NEED(cuEventSynchronize);
  CP_CTX(ctx);
  return cp_cu.cuEventSynchronize((cp_CUevent)ev);
}
int cp_cuEventQuery(void *ctx, void *ev) {
  CP_NEED(cuEventQuery);
  CP_CTX(ctx);
  return cp_cu.cuEventQuery((cp_CUevent)ev);
}
int cp_cuEventElapsedTime(void *ctx, float *ms, void *a, void *b) {
  CP_NEED(cuEventElapsedTime);
  CP_CTX(ctx);
  return cp_cu.cuEventElapsedTime(ms, (cp_CUevent)a, (cp_CUevent)b);
}
int cp_cuIpcGetMemHandle(void *ctx, void *handle64, cp_CUdeviceptr p) {
  CP_NEED(cuIpcGetMemHandle);
  CP_CTX(ctx);
  return cp_cu.cuIpcGetMemHandle((cp_CUipcMemHandle *)handle64, p);
}
int cp_cuIpcOpenMemHandle(void *ctx, cp_CUdeviceptr *p, const void *handle64, unsigned int flags) {
  cp_CUipcMemHandle h;
  CP_NEED(cuIpcOpenMemHandle_v2);
  CP_CTX(ctx);
  memcpy(&h, handle64, sizeof h);
  return cp_cu.cuIpcOpenMemHandle_v2(p, h, flags);
}
int cp_cuIpcCloseMemHandle(void *ctx, cp_CUdeviceptr p) {
  CP_NEED(cuIpcCloseMemHandle);
  CP_CTX(ctx);
  return cp_cu.cuIpcCloseMemHandle(p);
}
int cp_cuIpcGetEventHandle(void *ctx, void *handle64, void *ev) {
  CP_NEED(cuIpcGetEventHandle);
  CP_CTX(ctx);
  return cp_cu.cuIpcGetEventHandle((cp_CUipcEventHandle *)handle64, (cp_CUevent)ev);
}
int cp_cuIpcOpenEventHandle(void *ctx, void **ev, const void *handle64) {
  cp_CUipcEventHandle h;
  CP_NEED(cuIpcOpenEventHandle);
  CP_CTX(ctx);
  memcpy(&h, handle64, sizeof h);
  return cp_cu.cuIpcOpenEventHandle((cp_CUevent *)ev, h);
}
int cp_cuMemcpyBatch(void *ctx, cp_CUdeviceptr *dsts, cp_CUdeviceptr *srcs, size_t *sizes,
                     size_t count, void *st, size_t *fail_idx) {
  cp_CUmemcpyAttributes attr;
  size_t attr_idx = 0;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = CP_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  *fail_idx = (size_t)-1;
  if (cp_cu.cuMemcpyBatchAsync != NULL) {
    CP_CTX(ctx);
    return cp_cu.cuMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_idx, 1, fail_idx,
                                    (cp_CUstream)st);
  }
  if (cp_cu.cuMemcpyBatchAsync_v2 != NULL) {
    CP_CTX(ctx);
    return cp_cu.cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, &attr, &attr_idx, 1,
                                       (cp_CUstream)st);
  }
  return CP_NOT_LOADED;
}
