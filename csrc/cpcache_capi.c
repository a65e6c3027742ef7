// The C side of libcpcache (cmd/libcpcache): the public entry points of include/cpcache.h,
// and what must be C because it is thread-local or static storage the Go runtime must not
// own — the last-error message of each thread, the version string, the constant strings
// cpcache_info hands out.
//
// Every public function is defined here, in C, and checks first whether this process is a
// child forked after the library was loaded: the Go runtime does not survive a fork (only
// the forking thread does, so a call into Go can wait forever on a lock or a thread that no
// longer exists, or run on a copy of the parent's cache). Such a child gets
// CPCACHE_ERR_FORKED at once, naming the parent's pid, and never enters Go; the others call
// the Go function cpcapi_<name> (an //export of cmd/libcpcache). The list of these
// functions is csrc/cpcache_entries.h.
//
// The check is a load of a flag that a pthread_atfork child handler (registered by this
// file's constructor, when the library is loaded) sets in every child: about 0.3 ns. A
// getpid() comparison with the pid recorded at load would also catch a child made by a raw
// clone() that skips the handlers, but costs a system call per call (about 2 µs on the CI
// machine, more than most calls), so only cpcache_open and cpcache_close make it.
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

// The public prototypes first (cpcache_capi.h hides them from the Go side), so that each
// definition below is checked against the header's declaration.
#include "../include/cpcache.h"
#include "cpcache_capi.h"

static _Thread_local char last_error[1024];

// This process's pid, recorded when the library is loaded and again in every forked child.
static pid_t loaded_pid;
// The pid of the process this one was forked from after the library was loaded; 0 when it
// was not. Written only in the constructor and in the child handler, where no other thread
// of this process exists yet.
static pid_t forked_from;

static void cpcapi_after_fork_child(void) {
  forked_from = loaded_pid;
  loaded_pid = getpid();
}

__attribute__((constructor)) static void cpcapi_loaded(void) {
  loaded_pid = getpid();
  pthread_atfork(NULL, NULL, cpcapi_after_fork_child);
}

// in_forked_child: the check of every call (a flag the fork handler set).
static inline int in_forked_child(void) { return __builtin_expect(forked_from != 0, 0); }

// pid_changed: the system-call check of cpcache_open and cpcache_close, for a child whose
// fork skipped the handlers (a raw clone); it then counts as forked from the loading process.
static int pid_changed(void) {
  if (in_forked_child()) return 1;
  pid_t now = getpid();
  if (now == loaded_pid) return 0;
  forked_from = loaded_pid;
  loaded_pid = now;
  return 1;
}

// forked_error records the message of CPCACHE_ERR_FORKED for call fn on this thread.
static int forked_error(const char *fn) {
  snprintf(last_error, sizeof(last_error),
           "cpcache_%s: this process (pid %d) was forked from pid %d after libcpcache was loaded; the "
           "library cannot be used in a forked child: open the cache in the child with the spawn start "
           "method, or load the library after the fork",
           fn, (int)getpid(), (int)forked_from);
  return CPCACHE_ERR_FORKED;
}

// The Go functions behind the entry points (cmd/libcpcache, //export cpcapi_<name>), then
// the entry points.
#define CPCACHE_ENTRY(name, params, args) int cpcapi_##name params;
#include "cpcache_entries.h"
#undef CPCACHE_ENTRY

#define CPCACHE_ENTRY(name, params, args)              \
  int cpcache_##name params {                          \
    if (in_forked_child()) return forked_error(#name); \
    return cpcapi_##name args;                         \
  }
#define CPCACHE_ENTRY_PIDCHECK(name, params, args)     \
  int cpcache_##name params {                          \
    if (pid_changed()) return forked_error(#name);     \
    return cpcapi_##name args;                         \
  }
#include "cpcache_entries.h"
#undef CPCACHE_ENTRY
#undef CPCACHE_ENTRY_PIDCHECK

// The version string ("cpcache 0.1.0"), stored by the Go side's init (exports.go) so that a
// forked child can answer without entering Go.
static const char *version_string;

void cpcapi_set_version(const char *v) { version_string = v; }

// Exported by cmd/libcpcache (exports.go): the version, in static storage. A call made while
// the library is still loading waits there for the Go runtime's start.
extern char *cpcapi_version(void);

const char *cpcache_version(void) {
  if (in_forked_child()) {
    const char *v = version_string;
    return v ? v : "cpcache (unknown version: forked while libcpcache was starting)";
  }
  return cpcapi_version();
}

int cpcache_abi_version(void) { return CPCACHE_ABI_VERSION; }

const char *cpcache_last_error(void) { return last_error; }

int cpcapi_set_error(int code, const char *msg, size_t len) {
  if (len >= sizeof(last_error)) len = sizeof(last_error) - 1;
  memcpy(last_error, msg, len);
  last_error[len] = 0;
  return code;
}

const char *cpcapi_static_name(int which) {
  switch (which) {
  case CPCAPI_NAME_SHM:
    return "shm";
  case CPCAPI_NAME_GLOO:
    return "gloo";
  default:
    return "";
  }
}
