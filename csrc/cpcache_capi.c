// The C side of libcpcache (cmd/libcpcache): what must be C because it is thread-local or
// static storage the Go runtime must not own — the last-error message of each thread, the
// constant strings cpcache_info hands out. The version string is the Go side's
// (internal/version, set from the VERSION file at link time), returned through an export so
// that a call made while the library is still loading waits for the Go runtime's start.
#include <stdio.h>
#include <string.h>

#include "cpcache_capi.h"

static _Thread_local char last_error[1024];

// Exported by cmd/libcpcache (exports.go): "cpcache 0.1.0", in static storage.
extern char *cpcapi_version(void);

const char *cpcache_version(void) { return cpcapi_version(); }

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
