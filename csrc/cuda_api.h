/*
 * cuda_api.h — the CUDA driver API as cpcache uses it, declared from ABI facts (no CUDA header
 * is vendored or needed): handle types, the few constants, and the table of entry points that
 * cuda_loader.c resolves from libcuda.so.1 at run time.
 *
 * ABI notes (64-bit Linux):
 *  - CUresult is a C enum (int); CUdevice is int; CUdeviceptr is unsigned long long (the _v2
 *    ABI; the pre-3.2 ABI used 32-bit unsigned int, which is why the _v2 names matter).
 *  - CUcontext, CUstream and CUevent are opaque pointers.
 *  - CUipcMemHandle and CUipcEventHandle are structs of 64 bytes (CU_IPC_HANDLE_SIZE), passed
 *    by value to cuIpcOpenMemHandle_v2 / cuIpcOpenEventHandle.
 *  - The entry points named below are the exported symbols of the driver library; where a
 *    _v2 symbol exists it is the current ABI and the plain name is the older one.
 *  - cuMemcpyBatchAsync (CUDA 12.8) takes 9 arguments including size_t *failIdx; CUDA 13.0
 *    added cuMemcpyBatchAsync_v2 without failIdx (cuda.h 13 maps the plain name to it). The
 *    driver keeps exporting the 12.8 symbol with its 12.8 ABI, so either is safe by name.
 */
#ifndef CPCACHE_CUDA_API_H
#define CPCACHE_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "loader_status.h"

typedef int cp_CUresult;
typedef int cp_CUdevice;
typedef unsigned long long cp_CUdeviceptr;
typedef struct cp_CUctx_st *cp_CUcontext;
typedef struct cp_CUstream_st *cp_CUstream;
typedef struct cp_CUevent_st *cp_CUevent;

#define CP_CU_IPC_HANDLE_SIZE 64
typedef struct { char reserved[CP_CU_IPC_HANDLE_SIZE]; } cp_CUipcMemHandle;
typedef struct { char reserved[CP_CU_IPC_HANDLE_SIZE]; } cp_CUipcEventHandle;

/* CUmemLocation: { CUmemLocationType type; int id; } — 8 bytes. */
typedef struct { int type; int id; } cp_CUmemLocation;
/* CUmemcpyAttributes (CUDA 12.8): 24 bytes. */
typedef struct {
  int srcAccessOrder;          /* CUmemcpySrcAccessOrder */
  cp_CUmemLocation srcLocHint; /* hints, ignored for non-managed memory */
  cp_CUmemLocation dstLocHint;
  unsigned int flags;          /* CUmemcpyFlags */
} cp_CUmemcpyAttributes;

#define CP_CUDA_SUCCESS 0
#define CP_CUDA_ERROR_NOT_READY 600
#define CP_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM 1
#define CP_CU_STREAM_NON_BLOCKING 0x1
#define CP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1

/*
 * The entry-point table: X(name, since, optional, return type, parameter list).
 * "since" is the first CUDA release whose driver exports the symbol (for error messages).
 */
#define CP_CUDA_FUNCS(X)                                                                        \
  X(cuInit, "2.0", 0, cp_CUresult, (unsigned int flags))                                        \
  X(cuDriverGetVersion, "2.2", 0, cp_CUresult, (int *version))                                  \
  X(cuGetErrorString, "6.0", 0, cp_CUresult, (cp_CUresult e, const char **s))                   \
  X(cuGetErrorName, "6.0", 0, cp_CUresult, (cp_CUresult e, const char **s))                     \
  X(cuDeviceGetCount, "2.0", 0, cp_CUresult, (int *count))                                      \
  X(cuDeviceGet, "2.0", 0, cp_CUresult, (cp_CUdevice * dev, int ordinal))                       \
  X(cuDeviceGetName, "2.0", 0, cp_CUresult, (char *name, int len, cp_CUdevice dev))             \
  X(cuDeviceTotalMem_v2, "3.2", 0, cp_CUresult, (size_t * bytes, cp_CUdevice dev))              \
  X(cuDeviceGetAttribute, "2.0", 0, cp_CUresult, (int *v, int attr, cp_CUdevice dev))           \
  X(cuDeviceGetPCIBusId, "4.1", 0, cp_CUresult, (char *id, int len, cp_CUdevice dev))           \
  X(cuDevicePrimaryCtxRetain, "7.0", 0, cp_CUresult, (cp_CUcontext * ctx, cp_CUdevice dev))     \
  X(cuDevicePrimaryCtxRelease_v2, "11.0", 0, cp_CUresult, (cp_CUdevice dev))                    \
  X(cuCtxSetCurrent, "4.0", 0, cp_CUresult, (cp_CUcontext ctx))                                 \
  X(cuCtxSynchronize, "2.0", 0, cp_CUresult, (void))                                            \
  X(cuMemGetInfo_v2, "3.2", 0, cp_CUresult, (size_t * free, size_t *total))                     \
  X(cuMemAlloc_v2, "3.2", 0, cp_CUresult, (cp_CUdeviceptr * p, size_t n))                       \
  X(cuMemFree_v2, "3.2", 0, cp_CUresult, (cp_CUdeviceptr p))                                    \
  X(cuMemHostAlloc, "2.2", 0, cp_CUresult, (void **p, size_t n, unsigned int flags))            \
  X(cuMemFreeHost, "2.0", 0, cp_CUresult, (void *p))                                            \
  X(cuMemHostRegister_v2, "6.5", 0, cp_CUresult, (void *p, size_t n, unsigned int flags))       \
  X(cuMemHostUnregister, "4.0", 0, cp_CUresult, (void *p))                                      \
  X(cuMemHostGetDevicePointer_v2, "3.2", 0, cp_CUresult,                                        \
    (cp_CUdeviceptr * d, void *p, unsigned int flags))                                          \
  X(cuMemcpyHtoD_v2, "3.2", 0, cp_CUresult, (cp_CUdeviceptr d, const void *s, size_t n))        \
  X(cuMemcpyDtoH_v2, "3.2", 0, cp_CUresult, (void *d, cp_CUdeviceptr s, size_t n))              \
  X(cuMemcpyDtoD_v2, "3.2", 0, cp_CUresult, (cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n))     \
  X(cuMemcpyHtoDAsync_v2, "3.2", 0, cp_CUresult,                                                \
    (cp_CUdeviceptr d, const void *s, size_t n, cp_CUstream st))                                \
  X(cuMemcpyDtoHAsync_v2, "3.2", 0, cp_CUresult,                                                \
    (void *d, cp_CUdeviceptr s, size_t n, cp_CUstream st))                                      \
  X(cuMemcpyDtoDAsync_v2, "3.2", 0, cp_CUresult,                                                \
    (cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n, cp_CUstream st))                             \
  X(cuMemcpyAsync, "4.0", 0, cp_CUresult,                                                       \
    (cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n, cp_CUstream st))                             \
  X(cuMemsetD8_v2, "3.2", 0, cp_CUresult, (cp_CUdeviceptr d, unsigned char v, size_t n))        \
  X(cuMemsetD8Async, "3.2", 0, cp_CUresult,                                                     \
    (cp_CUdeviceptr d, unsigned char v, size_t n, cp_CUstream st))                              \
  X(cuStreamCreate, "2.0", 0, cp_CUresult, (cp_CUstream * st, unsigned int flags))              \
  X(cuStreamDestroy_v2, "4.0", 0, cp_CUresult, (cp_CUstream st))                                \
  X(cuStreamSynchronize, "2.0", 0, cp_CUresult, (cp_CUstream st))                               \
  X(cuStreamQuery, "2.0", 0, cp_CUresult, (cp_CUstream st))                                     \
  X(cuStreamWaitEvent, "3.2", 0, cp_CUresult, (cp_CUstream st, cp_CUevent ev, unsigned int f))  \
  X(cuEventCreate, "2.0", 0, cp_CUresult, (cp_CUevent * ev, unsigned int flags))                \
  X(cuEventDestroy_v2, "4.0", 0, cp_CUresult, (cp_CUevent ev))                                  \
  X(cuEventRecord, "2.0", 0, cp_CUresult, (cp_CUevent ev, cp_CUstream st))                      \
  X(cuEventSynchronize, "2.0", 0, cp_CUresult, (cp_CUevent ev))                                 \
  X(cuEventQuery, "2.0", 0, cp_CUresult, (cp_CUevent ev))                                       \
  X(cuEventElapsedTime, "2.0", 0, cp_CUresult, (float *ms, cp_CUevent a, cp_CUevent b))         \
  X(cuIpcGetMemHandle, "4.1", 0, cp_CUresult, (cp_CUipcMemHandle * h, cp_CUdeviceptr p))        \
  X(cuIpcOpenMemHandle_v2, "11.0", 0, cp_CUresult,                                              \
    (cp_CUdeviceptr * p, cp_CUipcMemHandle h, unsigned int flags))                              \
  X(cuIpcCloseMemHandle, "4.1", 0, cp_CUresult, (cp_CUdeviceptr p))                             \
  X(cuIpcGetEventHandle, "4.1", 0, cp_CUresult, (cp_CUipcEventHandle * h, cp_CUevent ev))       \
  X(cuIpcOpenEventHandle, "4.1", 0, cp_CUresult, (cp_CUevent * ev, cp_CUipcEventHandle h))      \
  X(cuMemcpyBatchAsync, "12.8", 1, cp_CUresult,                                                 \
    (cp_CUdeviceptr * dsts, cp_CUdeviceptr * srcs, size_t * sizes, size_t count,                \
     cp_CUmemcpyAttributes * attrs, size_t * attrIdxs, size_t numAttrs, size_t * failIdx,       \
     cp_CUstream st))                                                                           \
  X(cuMemcpyBatchAsync_v2, "13.0", 1, cp_CUresult,                                              \
    (cp_CUdeviceptr * dsts, cp_CUdeviceptr * srcs, size_t * sizes, size_t count,                \
     cp_CUmemcpyAttributes * attrs, size_t * attrIdxs, size_t numAttrs, cp_CUstream st))

#define CP_CUDA_FIELD(name, since, opt, ret, params) ret(*name) params;
typedef struct {
  CP_CUDA_FUNCS(CP_CUDA_FIELD)
} cp_cuda_table;
#undef CP_CUDA_FIELD

/* Loader entry points (cuda_loader.c). */
int cp_cuda_open(const char *const *candidates, int n, char *err, size_t cap);
int cp_cuda_close(void);
void cp_cuda_keep(void);
int cp_cuda_path(char *out, size_t cap);
int cp_cuda_symbol_count(void);
int cp_cuda_symbol(int i, const char **name, const char **since, int *optional);
/* cp_cuda_batch_abi: 0 no batch API, 1 the CUDA 12.8 symbol, 2 the CUDA 13 _v2 symbol. */
int cp_cuda_batch_abi(void);

/*
 * Calls. Every call that acts on a device takes the device's primary context and makes it
 * current on the calling thread first, so a goroutine that moved to another OS thread between
 * two calls is still right. When making the context current fails, the result is that
 * failure's CUresult with CP_CTX_FAILED or'ed in.
 */
#define CP_CTX_FAILED 0x40000000
#define CP_NOT_LOADED 0x20000000

int cp_cuInit(unsigned int flags);
int cp_cuDriverGetVersion(int *v);
const char *cp_cuErrorString(int code);
const char *cp_cuErrorName(int code);
int cp_cuDeviceGetCount(int *n);
int cp_cuDeviceGet(int *dev, int ordinal);
int cp_cuDeviceGetName(char *name, int len, int dev);
int cp_cuDeviceTotalMem(size_t *bytes, int dev);
int cp_cuDeviceGetAttribute(int *v, int attr, int dev);
int cp_cuDeviceGetPCIBusId(char *id, int len, int dev);
int cp_cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cp_cuDevicePrimaryCtxRelease(int dev);
int cp_cuCtxSetCurrent(void *ctx);
int cp_cuCtxSynchronize(void *ctx);
int cp_cuMemGetInfo(void *ctx, size_t *free, size_t *total);
int cp_cuMemAlloc(void *ctx, cp_CUdeviceptr *p, size_t n);
int cp_cuMemFree(void *ctx, cp_CUdeviceptr p);
int cp_cuMemHostAlloc(void *ctx, void **p, size_t n, unsigned int flags);
int cp_cuMemFreeHost(void *ctx, void *p);
int cp_cuMemHostRegister(void *ctx, uintptr_t p, size_t n, unsigned int flags);
int cp_cuMemHostUnregister(void *ctx, uintptr_t p);
int cp_cuMemHostGetDevicePointer(void *ctx, cp_CUdeviceptr *d, uintptr_t p);
int cp_cuMemcpyHtoD(void *ctx, cp_CUdeviceptr d, const void *s, size_t n);
int cp_cuMemcpyDtoH(void *ctx, void *d, cp_CUdeviceptr s, size_t n);
int cp_cuMemcpyDtoD(void *ctx, cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n);
int cp_cuMemcpyHtoDAsync(void *ctx, cp_CUdeviceptr d, const void *s, size_t n, void *st);
int cp_cuMemcpyDtoHAsync(void *ctx, void *d, cp_CUdeviceptr s, size_t n, void *st);
int cp_cuMemcpyDtoDAsync(void *ctx, cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n, void *st);
int cp_cuMemcpyAsync(void *ctx, cp_CUdeviceptr d, cp_CUdeviceptr s, size_t n, void *st);
int cp_cuMemsetD8(void *ctx, cp_CUdeviceptr d, unsigned char v, size_t n);
int cp_cuMemsetD8Async(void *ctx, cp_CUdeviceptr d, unsigned char v, size_t n, void *st);
int cp_cuStreamCreate(void *ctx, void **st, unsigned int flags);
int cp_cuStreamDestroy(void *ctx, void *st);
int cp_cuStreamSynchronize(void *ctx, void *st);
int cp_cuStreamQuery(void *ctx, void *st);
int cp_cuStreamWaitEvent(void *ctx, void *st, void *ev);
/* cp_cuStreamWaitEventRaw is cp_cuStreamWaitEvent for a stream of another library (a CUstream
 * given as an integer; 0 is the legacy default stream). */
int cp_cuStreamWaitEventRaw(void *ctx, uintptr_t st, void *ev);
int cp_cuEventCreate(void *ctx, void **ev, unsigned int flags);
int cp_cuEventDestroy(void *ctx, void *ev);
int cp_cuEventRecord(void *ctx, void *ev, void *st);
int cp_cuEventSynchronize(void *ctx, void *ev);
int cp_cuEventQuery(void *ctx, void *ev);
int cp_cuEventElapsedTime(void *ctx, float *ms, void *a, void *b);
int cp_cuIpcGetMemHandle(void *ctx, void *handle64, cp_CUdeviceptr p);
int cp_cuIpcOpenMemHandle(void *ctx, cp_CUdeviceptr *p, const void *handle64, unsigned int flags);
int cp_cuIpcCloseMemHandle(void *ctx, cp_CUdeviceptr p);
int cp_cuIpcGetEventHandle(void *ctx, void *handle64, void *ev);
int cp_cuIpcOpenEventHandle(void *ctx, void **ev, const void *handle64);
/* cp_cuMemcpyBatch enqueues count copies (any direction, unified addresses) on st with one
 * attribute entry (source access in stream order). *fail_idx is set by the 12.8 ABI only. */
int cp_cuMemcpyBatch(void *ctx, cp_CUdeviceptr *dsts, cp_CUdeviceptr *srcs, size_t *sizes,
                     size_t count, void *st, size_t *fail_idx);

#endif
