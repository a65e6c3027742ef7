// Internal declarations shared by cmd/libcpcache (Go) and csrc/cpcache_capi.c: the public
// types without the public prototypes (the public functions are csrc/cpcache_capi.c's; cgo
// declares the Go ones, cpcapi_*, itself, without const), plus the C helpers the Go side
// calls.
#ifndef CPCACHE_CAPI_H
#define CPCACHE_CAPI_H

#define CPCACHE_NO_PROTOTYPES
#include "../include/cpcache.h"

#define CPCAPI_NAME_SHM 1
#define CPCAPI_NAME_GLOO 2

const char *cpcache_version(void);
int cpcache_abi_version(void);
const char *cpcache_last_error(void);

// cpcapi_set_error stores msg[0..len) as this thread's last error and returns code.
int cpcapi_set_error(int code, const char *msg, size_t len);
// cpcapi_set_version stores the version string (static storage) for cpcache_version in a
// forked child, which must not enter Go.
void cpcapi_set_version(const char *v);
// cpcapi_static_name returns a string in static storage (CPCAPI_NAME_*).
const char *cpcapi_static_name(int which);

#endif
