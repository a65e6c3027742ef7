/*
 * nccl_api.h — NCCL as cpcache uses it, declared from ABI facts (no nccl.h needed): types,
 * enum values, the ncclConfig_t prefix, and the entry points nccl_loader.c resolves from
 * libnccl.so.2 at run time.
 *
 * ABI notes:
 *  - ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums (int). Values: see below.
 *  - ncclUniqueId is a struct of 128 bytes (NCCL_UNIQUE_ID_BYTES), passed by value to
 *    ncclCommInitRank / ncclCommInitRankConfig.
 *  - ncclComm_t is an opaque pointer; cudaStream_t is CUstream (an opaque pointer).
 *  - ncclConfig_t begins { size_t size; unsigned int magic; unsigned int version; int blocking; }
 *    and NCCL reads only `size` bytes of it, honouring fields by `version` (>= 2.14.0), so a
 *    caller may pass this 2.14 prefix with size = 20 and version = NCCL_VERSION(2,14,0); every
 *    later field takes NCCL's default. magic is 0xcafebeef.
 *  - NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
 */
#ifndef CPCACHE_NCCL_API_H
#define CPCACHE_NCCL_API_H

#include <stddef.h>
#include <stdint.h>

#include "loader_status.h"

typedef int cp_ncclResult_t;
typedef struct cp_ncclComm *cp_ncclComm_t;
typedef void *cp_cudaStream_t;

#define CP_NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[CP_NCCL_UNIQUE_ID_BYTES]; } cp_ncclUniqueId;

/* The ncclConfig_t prefix of NCCL 2.14. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} cp_ncclConfig_v21400;
#define CP_NCCL_CONFIG_MAGIC 0xcafebeefu
#define CP_NCCL_CONFIG_V21400_SIZE (offsetof(cp_ncclConfig_v21400, blocking) + sizeof(int))

enum {
  CP_ncclSuccess = 0,
  CP_ncclUnhandledCudaError = 1,
  CP_ncclSystemError = 2,
  CP_ncclInternalError = 3,
  CP_ncclInvalidArgument = 4,
  CP_ncclInvalidUsage = 5,
  CP_ncclRemoteError = 6,
  CP_ncclInProgress = 7
};

#define CP_NCCL_FUNCS(X)                                                                         \
  X(ncclGetVersion, "2.3", 0, cp_ncclResult_t, (int *version))                                  \
  X(ncclGetUniqueId, "2.0", 0, cp_ncclResult_t, (cp_ncclUniqueId * id))                          \
  X(ncclCommInitRank, "2.0", 0, cp_ncclResult_t,                                                 \
    (cp_ncclComm_t * comm, int nranks, cp_ncclUniqueId id, int rank))                            \
  X(ncclCommDestroy, "2.0", 0, cp_ncclResult_t, (cp_ncclComm_t comm))                            \
  X(ncclCommAbort, "2.4", 0, cp_ncclResult_t, (cp_ncclComm_t comm))                              \
  X(ncclGetErrorString, "2.0", 0, const char *, (cp_ncclResult_t r))                             \
  X(ncclCommGetAsyncError, "2.4", 0, cp_ncclResult_t, (cp_ncclComm_t comm, cp_ncclResult_t * r)) \
  X(ncclCommCount, "2.0", 0, cp_ncclResult_t, (const cp_ncclComm_t comm, int *count))           \
  X(ncclCommCuDevice, "2.0", 0, cp_ncclResult_t, (const cp_ncclComm_t comm, int *dev))          \
  X(ncclCommUserRank, "2.0", 0, cp_ncclResult_t, (const cp_ncclComm_t comm, int *rank))         \
  X(ncclAllReduce, "2.0", 0, cp_ncclResult_t,                                                    \
    (const void *send, void *recv, size_t count, int dtype, int op, cp_ncclComm_t comm,          \
     cp_cudaStream_t stream))                                                                    \
  X(ncclBroadcast, "2.2", 0, cp_ncclResult_t,                                                    \
    (const void *send, void *recv, size_t count, int dtype, int root, cp_ncclComm_t comm,        \
     cp_cudaStream_t stream))                                                                    \
  X(ncclAllGather, "2.0", 0, cp_ncclResult_t,                                                    \
    (const void *send, void *recv, size_t sendcount, int dtype, cp_ncclComm_t comm,              \
     cp_cudaStream_t stream))                                                                    \
  X(ncclReduceScatter, "2.0", 0, cp_ncclResult_t,                                                \
    (const void *send, void *recv, size_t recvcount, int dtype, int op, cp_ncclComm_t comm,      \
     cp_cudaStream_t stream))                                                                    \
  X(ncclGroupStart, "2.0", 0, cp_ncclResult_t, (void))                                           \
  X(ncclGroupEnd, "2.0", 0, cp_ncclResult_t, (void))                                             \
  X(ncclGetLastError, "2.13", 1, const char *, (cp_ncclComm_t comm))                             \
  X(ncclCommInitRankConfig, "2.14", 1, cp_ncclResult_t,                                          \
    (cp_ncclComm_t * comm, int nranks, cp_ncclUniqueId id, int rank, void *config))              \
  X(ncclCommFinalize, "2.14", 1, cp_ncclResult_t, (cp_ncclComm_t comm))                          \
  X(ncclCommSplit, "2.18", 1, cp_ncclResult_t,                                                   \
    (cp_ncclComm_t comm, int color, int key, cp_ncclComm_t *newcomm, void *config))

#define CP_NCCL_FIELD(name, since, opt, ret, params) ret(*name) params;
typedef struct {
  CP_NCCL_FUNCS(CP_NCCL_FIELD)
} cp_nccl_table;
#undef CP_NCCL_FIELD

/* Loader entry points (nccl_loader.c). */
int cp_nccl_open(const char *const *candidates, int n, char *err, size_t cap);
int cp_nccl_close(void);
void cp_nccl_keep(void);
int cp_nccl_path(char *out, size_t cap);
int cp_nccl_symbol_count(void);
int cp_nccl_symbol(int i, const char **name, const char **since, int *optional);
/* cp_nccl_has reports whether optional entry point `which` was resolved:
 * 0 ncclCommInitRankConfig, 1 ncclCommFinalize, 2 ncclCommSplit, 3 ncclGetLastError. */
int cp_nccl_has(int which);

/* Calls: the NCCL result, or CP_NCCL_NOT_LOADED when the entry point is absent. The caller
 * has made the right CUDA context current on this thread. */
#define CP_NCCL_NOT_LOADED 0x20000000
int cp_ncclGetVersion(int *v);
int cp_ncclGetUniqueId(void *id128);
const char *cp_ncclGetErrorString(int r);
const char *cp_ncclGetLastError(void *comm);
int cp_ncclCommInitRank(void **comm, int nranks, const void *id128, int rank);
/* cp_ncclCommInitRankConfig passes a 2.14 config prefix with the given blocking flag. */
int cp_ncclCommInitRankConfig(void **comm, int nranks, const void *id128, int rank, int blocking);
int cp_ncclCommSplit(void *comm, int color, int key, void **newcomm, int use_config, int blocking);
int cp_ncclCommFinalize(void *comm);
int cp_ncclCommDestroy(void *comm);
int cp_ncclCommAbort(void *comm);
int cp_ncclCommGetAsyncError(void *comm, int *r);
int cp_ncclCommCount(void *comm, int *n);
int cp_ncclCommCuDevice(void *comm, int *dev);
int cp_ncclCommUserRank(void *comm, int *rank);
int cp_ncclAllReduce(uint64_t send, uint64_t recv, size_t count, int dt, int op, void *comm, uintptr_t st);
int cp_ncclBroadcast(uint64_t send, uint64_t recv, size_t count, int dt, int root, void *comm, uintptr_t st);
int cp_ncclAllGather(uint64_t send, uint64_t recv, size_t count, int dt, void *comm, uintptr_t st);
int cp_ncclReduceScatter(uint64_t send, uint64_t recv, size_t count, int dt, int op, void *comm, uintptr_t st);
int cp_ncclGroupStart(void);
int cp_ncclGroupEnd(void);
/* Out-slots for the communicator NCCL creates. ncclCommSplit (and, in some versions,
 * ncclCommInitRank*) store the new communicator into the caller's `newcomm` from NCCL's own
 * job thread when the operation completes (init.cc ncclCommInitRankFunc:
 * __atomic_store_n(job->newcomm, comm)), i.e. after the call returned. The slot must
 * therefore be C memory that stays valid until the operation completed or was aborted:
 * never Go memory. cp_nccl_slot_new returns a zeroed slot (NULL when out of memory). */
void **cp_nccl_slot_new(void);
void *cp_nccl_slot_load(void **slot);
void cp_nccl_slot_free(void **slot);
/* For the ABI tests: the config prefix as it is sent. */
void cp_nccl_config_v21400(cp_ncclConfig_v21400 *c, int blocking);

#endif
