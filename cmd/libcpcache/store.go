package main

/*
#include <stdlib.h>
#include <string.h>
#include "../../csrc/cpcache_capi.h"

// cgo cannot call a C function pointer: these call the caller's store callbacks.
static int cpcapi_store_set(const cpcache_store *s, const char *k, size_t kl, const void *v, size_t vl, char *e, size_t el) {
  return s->set(s->ctx, k, kl, v, vl, e, el);
}
static int cpcapi_store_get(const cpcache_store *s, const char *k, size_t kl, int64_t ms, void *buf, size_t cap,
                            size_t *len, char *e, size_t el) {
  return s->get(s->ctx, k, kl, ms, buf, cap, len, e, el);
}
static int cpcapi_store_add(const cpcache_store *s, const char *k, size_t kl, int64_t d, int64_t *out, char *e, size_t el) {
  return s->add(s->ctx, k, kl, d, out, e, el);
}
static int cpcapi_store_del(const cpcache_store *s, const char *k, size_t kl, char *e, size_t el) {
  return s->del(s->ctx, k, kl, e, el);
}

extern char **environ;
static char **cpcapi_environ(void) { return environ; }
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/parallel"
)

// callbackStore is the caller's rendezvous store (cpcache_config.store) as a
// parallel.Store. The struct is a copy in C memory (never freed: a call gloo abandoned at its
// deadline may still use it after close).
type callbackStore struct {
	cs *C.cpcache_store
}

var _ parallel.Store = (*callbackStore)(nil)

// storeErrLen is the size of the message buffer a callback gets.
const storeErrLen = 1024

// newCallbackStore copies s, refusing NULL callbacks (naming them).
func newCallbackStore(s *C.cpcache_store) (*callbackStore, error) {
	var missing []string
	if s.set == nil {
		missing = append(missing, "set")
	}
	if s.get == nil {
		missing = append(missing, "get")
	}
	if s.add == nil {
		missing = append(missing, "add")
	}
	if s.del == nil {
		missing = append(missing, "del")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: cpcache_config.store: callback %s is NULL", errInvalid, strings.Join(missing, ", "))
	}
	cs := (*C.cpcache_store)(C.malloc(C.sizeof_cpcache_store))
	*cs = *s
	return &callbackStore{cs: cs}, nil
}

// call runs one callback with the key (C memory, NUL-terminated) and a message buffer.
func (c *callbackStore) call(op, key string, fn func(k *C.char, kl C.size_t, e *C.char) C.int) (C.int, error) {
	k := C.CString(key)
	defer C.free(unsafe.Pointer(k))
	e := (*C.char)(C.calloc(storeErrLen, 1))
	defer C.free(unsafe.Pointer(e))
	rc := fn(k, C.size_t(len(key)), e)
	switch rc {
	case C.CPCACHE_STORE_OK, C.CPCACHE_STORE_ABSENT:
		return rc, nil
	case C.CPCACHE_STORE_ERROR:
		msg := C.GoString(e)
		if msg == "" {
			msg = "failed (no message)"
		}
		return rc, fmt.Errorf("cpcache_config.store %s %q: %s", op, key, msg)
	}
	return rc, fmt.Errorf("cpcache_config.store %s %q: returned %d (want CPCACHE_STORE_OK, _ABSENT or _ERROR)", op, key, int(rc))
}

func (c *callbackStore) Set(_ context.Context, key string, value []byte) error {
	v := C.CBytes(value)
	defer C.free(v)
	_, err := c.call("set", key, func(k *C.char, kl C.size_t, e *C.char) C.int {
		return C.cpcapi_store_set(c.cs, k, kl, v, C.size_t(len(value)), e, storeErrLen)
	})
	return err
}

func (c *callbackStore) Get(_ context.Context, key string, wait time.Duration) ([]byte, bool, error) {
	ms := C.int64_t(wait.Milliseconds())
	if wait > 0 && ms == 0 {
		ms = 1
	}
	size := C.size_t(4096)
	for range 3 {
		buf := C.malloc(size)
		var n C.size_t
		rc, err := c.call("get", key, func(k *C.char, kl C.size_t, e *C.char) C.int {
			return C.cpcapi_store_get(c.cs, k, kl, ms, buf, size, &n, e, storeErrLen)
		})
		if err != nil || rc == C.CPCACHE_STORE_ABSENT {
			C.free(buf)
			return nil, false, err
		}
		if n <= size {
			v := C.GoBytes(buf, C.int(n))
			C.free(buf)
			return v, true, nil
		}
		C.free(buf)
		if n > C.CPCACHE_STORE_MAX_VALUE {
			return nil, false, fmt.Errorf("cpcache_config.store get %q: a value of %d bytes (at most %d)", key, uint64(n), C.CPCACHE_STORE_MAX_VALUE)
		}
		size, ms = n, 0
	}
	return nil, false, fmt.Errorf("cpcache_config.store get %q: the value's length changed at every call", key)
}

func (c *callbackStore) Add(_ context.Context, key string, delta int64) (int64, error) {
	var out C.int64_t
	_, err := c.call("add", key, func(k *C.char, kl C.size_t, e *C.char) C.int {
		return C.cpcapi_store_add(c.cs, k, kl, C.int64_t(delta), &out, e, storeErrLen)
	})
	return int64(out), err
}

func (c *callbackStore) Delete(_ context.Context, key string) error {
	_, err := c.call("del", key, func(k *C.char, kl C.size_t, e *C.char) C.int {
		return C.cpcapi_store_del(c.cs, k, kl, e, storeErrLen)
	})
	return err
}

// syncEnviron makes the Go runtime's environment the process's current one (C's environ):
// the Go runtime of a shared library copied the environment once, when it started, and
// misses what the process set since (Python's os.environ assignments call putenv). Variables
// that differ are set, those gone are unset.
func syncEnviron() {
	want := map[string]string{}
	if p := C.cpcapi_environ(); p != nil {
		for _, e := range unsafe.Slice(p, 1<<20) {
			if e == nil {
				break
			}
			k, v, ok := strings.Cut(C.GoString(e), "=")
			if _, seen := want[k]; ok && k != "" && !seen {
				want[k] = v
			}
		}
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := want[k]; !ok && k != "" {
			os.Unsetenv(k)
		}
	}
	for k, v := range want {
		if cur, ok := os.LookupEnv(k); !ok || cur != v {
			os.Setenv(k, v)
		}
	}
}
