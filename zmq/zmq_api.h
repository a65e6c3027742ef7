/*
 * zmq_api.h — libzmq as cpcache uses it, declared from ABI facts (no zmq.h needed): the entry
 * points zmq_loader.c resolves from libzmq.so.5 at run time (ZMQ 4.x; Debian's libzmq5).
 *
 * ABI notes:
 *  - contexts and sockets are opaque pointers; errors are -1 with the reason in zmq_errno().
 *  - zmq_msg_t is 64 bytes aligned as a pointer; only the C side here ever holds one.
 *  - zmq_pollitem_t is { void *socket; int fd; short events; short revents; } on POSIX.
 *  - ZMQ_MAXMSGSIZE takes an int64_t; the other options used here take an int.
 */
#ifndef CPCACHE_ZMQ_API_H
#define CPCACHE_ZMQ_API_H

#include <stddef.h>
#include <stdint.h>

#include "../csrc/loader_status.h"

typedef struct {
  unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) cp_zmq_msg_t;

typedef struct {
  void *socket;
  int fd;
  short events;
  short revents;
} cp_zmq_pollitem_t;

#define CP_ZMQ_FUNCS(X)                                                                   \
  X(zmq_version, "4.0", 0, void, (int *major, int *minor, int *patch))                     \
  X(zmq_errno, "4.0", 0, int, (void))                                                      \
  X(zmq_strerror, "4.0", 0, const char *, (int errnum))                                    \
  X(zmq_ctx_new, "4.0", 0, void *, (void))                                                 \
  X(zmq_ctx_term, "4.0", 0, int, (void *ctx))                                              \
  X(zmq_socket, "4.0", 0, void *, (void *ctx, int type))                                   \
  X(zmq_close, "4.0", 0, int, (void *s))                                                   \
  X(zmq_setsockopt, "4.0", 0, int, (void *s, int opt, const void *val, size_t len))        \
  X(zmq_getsockopt, "4.0", 0, int, (void *s, int opt, void *val, size_t *len))             \
  X(zmq_bind, "4.0", 0, int, (void *s, const char *addr))                                  \
  X(zmq_connect, "4.0", 0, int, (void *s, const char *addr))                               \
  X(zmq_send, "4.0", 0, int, (void *s, const void *buf, size_t len, int flags))            \
  X(zmq_msg_init, "4.0", 0, int, (cp_zmq_msg_t * m))                                       \
  X(zmq_msg_recv, "4.0", 0, int, (cp_zmq_msg_t * m, void *s, int flags))                   \
  X(zmq_msg_data, "4.0", 0, void *, (cp_zmq_msg_t * m))                                    \
  X(zmq_msg_size, "4.0", 0, size_t, (const cp_zmq_msg_t *m))                               \
  X(zmq_msg_more, "4.0", 0, int, (const cp_zmq_msg_t *m))                                  \
  X(zmq_msg_close, "4.0", 0, int, (cp_zmq_msg_t * m))                                      \
  X(zmq_poll, "4.0", 0, int, (cp_zmq_pollitem_t * items, int n, long timeout))             \
  X(zmq_socket_monitor, "4.0", 0, int, (void *s, const char *addr, int events))

#define CP_ZMQ_FIELD(name, since, opt, ret, params) ret(*name) params;
typedef struct {
  CP_ZMQ_FUNCS(CP_ZMQ_FIELD)
} cp_zmq_table;
#undef CP_ZMQ_FIELD

int cp_zmq_open(const char *const *candidates, int n, char *err, size_t cap);
int cp_zmq_path(char *out, size_t cap);
void cp_zmq_version(int *major, int *minor, int *patch);
int cp_zmq_errno(void);
const char *cp_zmq_strerror(int e);
void *cp_zmq_ctx_new(void);
int cp_zmq_ctx_term(void *ctx);
void *cp_zmq_socket(void *ctx, int type);
int cp_zmq_close(void *s);
int cp_zmq_setsockopt(void *s, int opt, const void *val, size_t len);
int cp_zmq_getsockopt(void *s, int opt, void *val, size_t *len);
int cp_zmq_bind(void *s, const char *addr);
int cp_zmq_connect(void *s, const char *addr);
int cp_zmq_send(void *s, const void *buf, size_t len, int flags);
/* cp_zmq_recv_frame receives one frame into a fresh message kept in *msg (free it with
 * cp_zmq_msg_free once its bytes are copied); -1 on error (nothing to free). */
int cp_zmq_recv_frame(void *s, int flags, void **msg, void **data, size_t *size, int *more);
void cp_zmq_msg_free(void *msg);
int cp_zmq_poll(cp_zmq_pollitem_t *items, int n, long timeout);
int cp_zmq_socket_monitor(void *s, const char *addr, int events);

#endif
