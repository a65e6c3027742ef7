/*
 * nccl_loader.c — loads libnccl.so.2 at run time and exposes thin call trampolines for Go.
 * See nccl_api.h for the ABI notes.
 */
#include "loader.h"
#include <stdlib.h>

#include "nccl_api.h"

static cp_lib cp_nccl_lib = CP_LIB_INIT;
static cp_nccl_table cp_nc; /* filled while cp_nccl_lib.mu is held; read after a successful open */

#define CP_NCCL_SPEC(name, since, opt, ret, params) {#name, "NCCL " since, opt, offsetof(cp_nccl_table, name)},
static const cp_sym_spec cp_nccl_specs[] = {CP_NCCL_FUNCS(CP_NCCL_SPEC)};
#undef CP_NCCL_SPEC
#define CP_NCCL_NSPECS ((int)(sizeof cp_nccl_specs / sizeof cp_nccl_specs[0]))

int cp_nccl_open(const char *const *candidates, int n, char *err, size_t cap) {
  pthread_mutex_lock(&cp_nccl_lib.mu);
  int rc = cp_lib_open_locked(&cp_nccl_lib, candidates, n, cp_nccl_specs, CP_NCCL_NSPECS, &cp_nc,
                              sizeof cp_nc, err, cap);
  pthread_mutex_unlock(&cp_nccl_lib.mu);
  return rc;
}

int cp_nccl_close(void) {
  pthread_mutex_lock(&cp_nccl_lib.mu);
  int left = cp_lib_close_locked(&cp_nccl_lib);
  if (cp_nccl_lib.handle == NULL) memset(&cp_nc, 0, sizeof cp_nc);
  pthread_mutex_unlock(&cp_nccl_lib.mu);
  return left;
}

void cp_nccl_keep(void) {
  pthread_mutex_lock(&cp_nccl_lib.mu);
  cp_nccl_lib.keep = 1;
  pthread_mutex_unlock(&cp_nccl_lib.mu);
}

int cp_nccl_path(char *out, size_t cap) {
  pthread_mutex_lock(&cp_nccl_lib.mu);
  int loaded = cp_nccl_lib.handle != NULL;
  snprintf(out, cap, "%s", cp_nccl_lib.path);
  pthread_mutex_unlock(&cp_nccl_lib.mu);
  return loaded;
}

int cp_nccl_symbol_count(void) { return CP_NCCL_NSPECS; }

int cp_nccl_symbol(int i, const char **name, const char **since, int *optional) {
  if (i < 0 || i >= CP_NCCL_NSPECS) return -1;
  *name = cp_nccl_specs[i].name;
  *since = cp_nccl_specs[i].since;
  *optional = cp_nccl_specs[i].optional;
  return 0;
}

int cp_nccl_has(int which) {
  switch (which) {
    case 0: return cp_nc.ncclCommInitRankConfig != NULL;
    case 1: return cp_nc.ncclCommFinalize != NULL;
    case 2: return cp_nc.ncclCommSplit != NULL;
    case 3: return cp_nc.ncclGetLastError != NULL;
  }
  return 0;
}

void cp_nccl_config_v21400(cp_ncclConfig_v21400 *c, int blocking) {
  memset(c, 0, sizeof *c);
  c->size = CP_NCCL_CONFIG_V21400_SIZE;
  c->magic = CP_NCCL_CONFIG_MAGIC;
  c->version = 21400; /* NCCL_VERSION(2,14,0) */
  c->blocking = blocking;
}

void **cp_nccl_slot_new(void) { return (void **)calloc(1, sizeof(void *)); }
void *cp_nccl_slot_load(void **slot) { return __atomic_load_n(slot, __ATOMIC_ACQUIRE); }
void cp_nccl_slot_free(void **slot) { free(slot); }

#define CP_NEED(fn) \
  if (cp_nc.fn == NULL) return CP_NCCL_NOT_LOADED

int cp_ncclGetVersion(int *v) {
  CP_NEED(ncclGetVersion);
  return cp_nc.ncclGetVersion(v);
}
int cp_ncclGetUniqueId(void *id128) {
  CP_NEED(ncclGetUniqueId);
  return cp_nc.ncclGetUniqueId((cp_ncclUniqueId *)id128);
}
const char *cp_ncclGetErrorString(int r) {
  if (cp_nc.ncclGetErrorString == NULL) return NULL;
  return cp_nc.ncclGetErrorString(r);
}
const char *cp_ncclGetLastError(void *comm) {
  if (cp_nc.ncclGetLastError == NULL) return NULL;
  return cp_nc.ncclGetLastError((cp_ncclComm_t)comm);
}
int cp_ncclCommInitRank(void **comm, int nranks, const void *id128, int rank) {
  cp_ncclUniqueId id;
  CP_NEED(ncclCommInitRank);
  memcpy(&id, id128, sizeof id);
  return cp_nc.ncclCommInitRank((cp_ncclComm_t *)comm, nranks, id, rank);
}
int cp_ncclCommInitRankConfig(void **comm, int nranks, const void *id128, int rank, int blocking) {
  cp_ncclUniqueId id;
  cp_ncclConfig_v21400 cfg;
  CP_NEED(ncclCommInitRankConfig);
  memcpy(&id, id128, sizeof id);
  cp_nccl_config_v21400(&cfg, blocking);
  return cp_nc.ncclCommInitRankConfig((cp_ncclComm_t *)comm, nranks, id, rank, &cfg);
}
int cp_ncclCommSplit(void *comm, int color, int key, void **newcomm, int use_config, int blocking) {
  cp_ncclConfig_v21400 cfg;
  CP_NEED(ncclCommSplit);
  cp_nccl_config_v21400(&cfg, blocking);
  return cp_nc.ncclCommSplit((cp_ncclComm_t)comm, color, key, (cp_ncclComm_t *)newcomm,
                             use_config ? &cfg : NULL);
}
int cp_ncclCommFinalize(void *comm) {
  CP_NEED(ncclCommFinalize);
  return cp_nc.ncclCommFinalize((cp_ncclComm_t)comm);
}
int cp_ncclCommDestroy(void *comm) {
  CP_NEED(ncclCommDestroy);
  return cp_nc.ncclCommDestroy((cp_ncclComm_t)comm);
}
int cp_ncclCommAbort(void *comm) {
  CP_NEED(ncclCommAbort);
  return cp_nc.ncclCommAbort((cp_ncclComm_t)comm);
}
int cp_ncclCommGetAsyncError(void *comm, int *r) {
  CP_NEED(ncclCommGetAsyncError);
  return cp_nc.ncclCommGetAsyncError((cp_ncclComm_t)comm, r);
}
int cp_ncclCommCount(void *comm, int *n) {
  CP_NEED(ncclCommCount);
  return cp_nc.ncclCommCount((cp_ncclComm_t)comm, n);
}
int cp_ncclCommCuDevice(void *comm, int *dev) {
  CP_NEED(ncclCommCuDevice);
  return cp_nc.ncclCommCuDevice((cp_ncclComm_t)comm, dev);
}
int cp_ncclCommUserRank(void *comm, int *rank) {
  CP_NEED(ncclCommUserRank);
  return cp_nc.ncclCommUserRank((cp_ncclComm_t)comm, rank);
}
int cp_ncclAllReduce(uint64_t send, uint64_t recv, size_t count, int dt, int op, void *comm, uintptr_t st) {
  CP_NEED(ncclAllReduce);
  return cp_nc.ncclAllReduce((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, op,
                             (cp_ncclComm_t)comm, (cp_cudaStream_t)st);
}
int cp_ncclBroadcast(uint64_t send, uint64_t recv, size_t count, int dt, int root, void *comm, uintptr_t st) {
  CP_NEED(ncclBroadcast);
  return cp_nc.ncclBroadcast((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, root,
                             (cp_ncclComm_t)comm, (cp_cudaStream_t)st);
}
int cp_ncclAllGather(uint64_t send, uint64_t recv, size_t count, int dt, void *comm, uintptr_t st) {
  CP_NEED(ncclAllGather);
  return cp_nc.ncclAllGather((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt,
                             (cp_ncclComm_t)comm, (cp_cudaStream_t)st);
}
int cp_ncclReduceScatter(uint64_t send, uint64_t recv, size_t count, int dt, int op, void *comm, uintptr_t st) {
  CP_NEED(ncclReduceScatter);
  return cp_nc.ncclReduceScatter((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, op,
                                 (cp_ncclComm_t)comm, (cp_cudaStream_t)st);
}
int cp_ncclGroupStart(void) {
  CP_NEED(ncclGroupStart);
  return cp_nc.ncclGroupStart();
}
int cp_ncclGroupEnd(void) {
  CP_NEED(ncclGroupEnd);
  return cp_nc.ncclGroupEnd();
}
