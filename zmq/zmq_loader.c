/*
 * zmq_loader.c — loads libzmq.so.5 at run time and exposes thin call trampolines for Go.
 * See zmq_api.h for the ABI notes. Once loaded, the library stays mapped (its contexts run
 * I/O threads), so there is no close.
 */
#include "../csrc/loader.h"
#include <errno.h>
#include <stdlib.h>

#include "zmq_api.h"

static cp_lib cp_zmq_lib = CP_LIB_INIT;
static cp_zmq_table cp_zt; /* filled while cp_zmq_lib.mu is held; read after a successful open */

#define CP_ZMQ_SPEC(name, since, opt, ret, params) {#name, "ZMQ " since, opt, offsetof(cp_zmq_table, name)},
static const cp_sym_spec cp_zmq_specs[] = {CP_ZMQ_FUNCS(CP_ZMQ_SPEC)};
#undef CP_ZMQ_SPEC
#define CP_ZMQ_NSPECS ((int)(sizeof cp_zmq_specs / sizeof cp_zmq_specs[0]))

int cp_zmq_open(const char *const *candidates, int n, char *err, size_t cap) {
  pthread_mutex_lock(&cp_zmq_lib.mu);
  int rc = CP_LOAD_OK;
  if (cp_zmq_lib.handle == NULL) {
    rc = cp_lib_open_locked(&cp_zmq_lib, candidates, n, cp_zmq_specs, CP_ZMQ_NSPECS, &cp_zt,
                            sizeof cp_zt, err, cap);
    cp_zmq_lib.keep = 1;
  }
  pthread_mutex_unlock(&cp_zmq_lib.mu);
  return rc;
}

int cp_zmq_path(char *out, size_t cap) {
  pthread_mutex_lock(&cp_zmq_lib.mu);
  int loaded = cp_zmq_lib.handle != NULL;
  snprintf(out, cap, "%s", cp_zmq_lib.path);
  pthread_mutex_unlock(&cp_zmq_lib.mu);
  return loaded;
}

/* Every trampoline below is called only after a successful cp_zmq_open (the Go side checks). */
void cp_zmq_version(int *major, int *minor, int *patch) { cp_zt.zmq_version(major, minor, patch); }
int cp_zmq_errno(void) { return cp_zt.zmq_errno(); }
const char *cp_zmq_strerror(int e) { return cp_zt.zmq_strerror(e); }
void *cp_zmq_ctx_new(void) { return cp_zt.zmq_ctx_new(); }
int cp_zmq_ctx_term(void *ctx) { return cp_zt.zmq_ctx_term(ctx); }
void *cp_zmq_socket(void *ctx, int type) { return cp_zt.zmq_socket(ctx, type); }
int cp_zmq_close(void *s) { return cp_zt.zmq_close(s); }
int cp_zmq_setsockopt(void *s, int opt, const void *val, size_t len) {
  return cp_zt.zmq_setsockopt(s, opt, val, len);
}
int cp_zmq_getsockopt(void *s, int opt, void *val, size_t *len) {
  return cp_zt.zmq_getsockopt(s, opt, val, len);
}
int cp_zmq_bind(void *s, const char *addr) { return cp_zt.zmq_bind(s, addr); }
int cp_zmq_connect(void *s, const char *addr) { return cp_zt.zmq_connect(s, addr); }
int cp_zmq_send(void *s, const void *buf, size_t len, int flags) {
  return cp_zt.zmq_send(s, buf, len, flags);
}

int cp_zmq_recv_frame(void *s, int flags, void **msg, void **data, size_t *size, int *more) {
  cp_zmq_msg_t *m = malloc(sizeof *m);
  if (m == NULL) return -2;
  cp_zt.zmq_msg_init(m);
  if (cp_zt.zmq_msg_recv(m, s, flags) < 0) {
    int e = cp_zt.zmq_errno();
    cp_zt.zmq_msg_close(m);
    free(m);
    errno = e;
    return -1;
  }
  *msg = m;
  *data = cp_zt.zmq_msg_data(m);
  *size = cp_zt.zmq_msg_size(m);
  *more = cp_zt.zmq_msg_more(m);
  return 0;
}

void cp_zmq_msg_free(void *msg) {
  cp_zt.zmq_msg_close((cp_zmq_msg_t *)msg);
  free(msg);
}

int cp_zmq_poll(cp_zmq_pollitem_t *items, int n, long timeout) {
  return cp_zt.zmq_poll(items, n, timeout);
}
int cp_zmq_socket_monitor(void *s, const char *addr, int events) {
  return cp_zt.zmq_socket_monitor(s, addr, events);
}
