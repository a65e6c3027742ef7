/*
 * loader.h — the generic half of cpcache's run-time library loaders (C only, no Go).
 *
 * A loader opens the first loadable file from a list of candidate paths (computed by the Go
 * side: an environment override, the default soname, then well-known locations), resolves
 * every symbol of a table with dlsym, and reports precisely what failed: every candidate it
 * tried with dlerror's message, or every missing required symbol with the minimum library
 * version that has it. Optional symbols resolve to NULL when absent.
 *
 * Everything here is `static` so that each cgo package (cuda/, nccl/) that includes a loader
 * gets its own private copy and the final link never sees duplicate definitions.
 */
#ifndef CPCACHE_LOADER_H
#define CPCACHE_LOADER_H

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* One entry of a symbol table: the exported name, the first library version that has it (for
 * messages), whether it may be absent, and where its address goes. */
typedef struct {
  const char *name;
  const char *since;
  int optional;
  size_t offset; /* byte offset of the function pointer inside the library's table struct */
} cp_sym_spec;

#include "loader_status.h"

/* A loaded library, reference counted. Protected by mu. */
typedef struct {
  pthread_mutex_t mu;
  void *handle;        /* dlopen handle, NULL when not loaded */
  int refs;            /* open references */
  int keep;            /* never dlclose: the library started threads or global state */
  char path[4096];     /* the candidate that was opened */
} cp_lib;

#define CP_LIB_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, {0}}

/* cp_appendf appends a formatted string to err (capacity cap), truncating safely. */
static void cp_appendf(char *err, size_t cap, const char *fmt, const char *a, const char *b) {
  size_t used = strlen(err);
  if (used + 1 >= cap) return;
  snprintf(err + used, cap - used, fmt, a, b);
}

/*
 * cp_lib_open_locked opens the library (when not open yet) and fills table from specs.
 * lib->mu must be held. On failure err (capacity cap) holds a one-line description.
 */
static int cp_lib_open_locked(cp_lib *lib, const char *const *candidates, int ncandidates,
                              const cp_sym_spec *specs, int nspecs, void *table,
                              size_t table_size, char *err, size_t cap) {
  int i;
  err[0] = 0;
  if (lib->handle != NULL) {
    lib->refs++;
    return CP_LOAD_OK;
  }
  if (ncandidates <= 0) {
    cp_appendf(err, cap, "%s%s", "no candidate paths", "");
    return CP_LOAD_BAD_ARGUMENT;
  }
  void *h = NULL;
  const char *opened = NULL;
  for (i = 0; i < ncandidates; i++) {
    dlerror();
    h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) {
      opened = candidates[i];
      break;
    }
    const char *why = dlerror();
    cp_appendf(err, cap, "%s%s", i == 0 ? "" : "; ", "");
    if (why != NULL && strncmp(why, candidates[i], strlen(candidates[i])) == 0)
      cp_appendf(err, cap, "%s%s", why, ""); /* dlerror already names the file */
    else
      cp_appendf(err, cap, "%s: %s", candidates[i], why ? why : "unknown dlopen error");
  }
  if (h == NULL) return CP_LOAD_NO_LIBRARY;
  err[0] = 0;
  int missing = 0;
  for (i = 0; i < nspecs; i++) {
    dlerror();
    void *p = dlsym(h, specs[i].name);
    if (p == NULL && !specs[i].optional) {
      cp_appendf(err, cap, "%s%s", missing ? ", " : "", specs[i].name);
      cp_appendf(err, cap, " (since %s)%s", specs[i].since, "");
      missing++;
    }
    memcpy((char *)table + specs[i].offset, &p, sizeof p);
  }
  if (missing) {
    /* Prefix the path so the message reads "<path>: missing a, b". */
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s", err);
    snprintf(err, cap, "%s: missing symbol%s %s", opened, missing > 1 ? "s" : "", tmp);
    memset(table, 0, table_size);
    dlclose(h);
    return CP_LOAD_MISSING_SYMBOL;
  }
  lib->handle = h;
  lib->refs = 1;
  snprintf(lib->path, sizeof lib->path, "%s", opened);
  return CP_LOAD_OK;
}

/* cp_lib_close_locked drops one reference; the last one dlcloses unless lib->keep is set.
 * Returns the remaining count. lib->mu must be held. */
static int cp_lib_close_locked(cp_lib *lib) {
  if (lib->refs <= 0) return 0;
  lib->refs--;
  if (lib->refs == 0 && !lib->keep && lib->handle != NULL) {
    dlclose(lib->handle);
    lib->handle = NULL;
    lib->path[0] = 0;
  }
  return lib->refs;
}

#endif
