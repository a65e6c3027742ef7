/*
 * gloo_shim.h — a C ABI over Gloo's C++ API (rendezvous stores, TCP devices, contexts and
 * the collectives cpcache needs). No C++ exception crosses this boundary: every entry point
 * catches everything and returns one of the CPG_* codes, with a message in err (always
 * NUL-terminated, truncated to errlen).
 *
 * Ownership: every *_new / *_open returns a handle the caller frees with the matching
 * *_close; buffers returned through out-pointers are malloc'd and freed with cpg_free.
 * Data pointers passed in are only used during the call (the shim copies them), so Go
 * memory may be passed directly.
 *
 * Threading: a store handle and a context handle are each used by one thread at a time
 * (callers serialise); a device may be shared by any number of contexts.
 */
#ifndef CPCACHE_GLOO_SHIM_H
#define CPCACHE_GLOO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  CPG_OK = 0,
  CPG_TIMEOUT = 1,   /* the deadline passed (Gloo "Timed out" / store wait timeout) */
  CPG_IO = 2,        /* a connection broke: a peer exited or closed its context */
  CPG_INVALID = 3,   /* bad argument, detected before any communication */
  CPG_ERROR = 4,     /* any other failure (Gloo enforce, allocation, ...) */
  CPG_MISMATCH = 5,  /* members called different collectives (or with different arguments) */
};

/* Reductions for cpg_allreduce_i64. */
enum { CPG_MIN = 0, CPG_MAX = 1, CPG_SUM = 2 };

typedef struct cpg_store cpg_store;
typedef struct cpg_device cpg_device;
typedef struct cpg_ctx cpg_ctx;

void cpg_free(void* p);

/* Stores. A store is the caller's: Gloo's rendezvous reads and writes keys through ops, with
 * the handle h, and the caller bounds every call (so a store that stops answering cannot
 * hold a rendezvous past the caller's deadline).
 *   set: creates or replaces key (klen bytes) with n bytes of data.
 *   get: waits up to timeout_ms (-1: the caller's own bound) for key, then returns its value
 *        in *data (malloc'd, *n bytes; freed by the shim with free()).
 * Both return a CPG_* code (CPG_TIMEOUT when the bound passed) and a message in err. */
typedef int (*cpg_store_set_fn)(uintptr_t h, char* key, size_t klen, char* data, size_t n, char* err,
                                size_t errlen);
typedef int (*cpg_store_get_fn)(uintptr_t h, char* key, size_t klen, int64_t timeout_ms, void** data,
                                size_t* n, char* err, size_t errlen);
typedef struct cpg_store_ops {
  cpg_store_set_fn set;
  cpg_store_get_fn get;
} cpg_store_ops;
int cpg_store_new(const cpg_store_ops* ops, uintptr_t h, cpg_store** out, char* err, size_t errlen);
void cpg_store_close(cpg_store* s);

/* A TCP device bound to iface (if non-empty), else to hostname (if non-empty), else to the
 * address the machine's hostname resolves to. */
int cpg_device_new(const char* hostname, const char* iface, cpg_device** out, char* err,
                   size_t errlen);
/* The address the device listens on, as Gloo prints it (for messages). */
int cpg_device_str(cpg_device* d, char* buf, size_t buflen);
void cpg_device_close(cpg_device* d);

/* Creates a full-mesh context of size ranks through store keys under prefix. */
int cpg_ctx_new(cpg_store* s, const char* prefix, int rank, int size, cpg_device* d,
                int64_t timeout_ms, cpg_ctx** out, char* err, size_t errlen);
/* Closes every connection (peers' pending operations fail) and frees the context. */
void cpg_ctx_close(cpg_ctx* c);

/* Collectives. On CPG_IO the context closes its connections so that the failure reaches
 * every peer promptly; the context must not be used afterwards except to close it.
 *
 * Groups of up to 32 members (CPCACHE_GLOO_DIRECT_MAX, read when a context is created,
 * changes the limit; 0 means never) exchange small messages directly (every member sends one
 * fixed-size frame to every other: one network hop, not the 2(n-1) of a ring), and each
 * frame names its collective and arguments, so members that call different collectives fail
 * with CPG_MISMATCH. Payloads beyond a frame take a second phase (direct, or Gloo's ring
 * allreduce / allgatherv); larger groups use Gloo's algorithms throughout. */
int cpg_allreduce_i64(cpg_ctx* c, int op, int64_t* vals, size_t n, int64_t timeout_ms,
                      char* err, size_t errlen);
/* Broadcasts root's n bytes; every member gets a malloc'd copy in *out (*outlen bytes). */
int cpg_broadcast(cpg_ctx* c, int root, const void* in, size_t n, int64_t timeout_ms,
                  void** out, size_t* outlen, char* err, size_t errlen);
/* Gathers every member's bytes (lengths may differ): *out holds them concatenated in rank
 * order, *lens (size entries, malloc'd) their lengths. */
int cpg_allgather(cpg_ctx* c, const void* in, size_t n, int64_t timeout_ms, void** out,
                  size_t** lens, char* err, size_t errlen);
int cpg_barrier(cpg_ctx* c, int64_t timeout_ms, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* CPCACHE_GLOO_SHIM_H */
