package gloo

/*
#cgo CXXFLAGS: -std=c++17 -O2 -I/usr/include/hiredis
#cgo LDFLAGS: -lgloo -lhiredis -lstdc++
#include <stdlib.h>
#include "../csrc/gloo_shim.h"

// The store operations, exported by storecb.go.
extern int cpgoStoreSet(uintptr_t h, char* key, size_t klen, char* data, size_t n, char* err, size_t errlen);
extern int cpgoStoreGet(uintptr_t h, char* key, size_t klen, int64_t timeout_ms, void** data, size_t* n, char* err, size_t errlen);
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/internal/sigpipe"
)

// errLen is the size of the message buffer every shim call gets.
const errLen = 1024

// shimError is a failed shim call: its code (C.CPG_*) and Gloo's message.
type shimError struct {
	code int
	msg  string
}

func (e *shimError) Error() string { return e.msg }

func check(code C.int, buf []C.char) error {
	if code == C.CPG_OK {
		return nil
	}
	return &shimError{code: int(code), msg: C.GoString(&buf[0])}
}

func millis(d time.Duration) C.int64_t {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return C.int64_t(ms)
}

// cStore is the shim's handle on a store whose operations are the Go functions of
// storecb.go (h names the *store they act on). Not safe for concurrent use.
type cStore struct{ p *C.cpg_store }

func newCStore(h uintptr) (*cStore, error) {
	ops := C.cpg_store_ops{set: C.cpg_store_set_fn(C.cpgoStoreSet), get: C.cpg_store_get_fn(C.cpgoStoreGet)}
	var s *C.cpg_store
	buf := make([]C.char, errLen)
	if err := check(C.cpg_store_new(&ops, C.uintptr_t(h), &s, &buf[0], errLen), buf); err != nil {
		return nil, err
	}
	return &cStore{p: s}, nil
}

func (s *cStore) close() {
	if s != nil && s.p != nil {
		C.cpg_store_close(s.p)
		s.p = nil
	}
}

// cDevice is a TCP device, shared by every context of a process's world.
type cDevice struct{ p *C.cpg_device }

func newDevice(hostname, iface string) (*cDevice, error) {
	sigpipe.Catch() // Gloo writes to sockets without MSG_NOSIGNAL: a peer gone mid-write is an EPIPE, not this rank killed
	ch, ci := C.CString(hostname), C.CString(iface)
	defer C.free(unsafe.Pointer(ch))
	defer C.free(unsafe.Pointer(ci))
	var d *C.cpg_device
	buf := make([]C.char, errLen)
	if err := check(C.cpg_device_new(ch, ci, &d, &buf[0], errLen), buf); err != nil {
		return nil, err
	}
	return &cDevice{p: d}, nil
}

func (d *cDevice) String() string {
	buf := make([]C.char, 256)
	if C.cpg_device_str(d.p, &buf[0], 256) != C.CPG_OK {
		return "?"
	}
	return C.GoString(&buf[0])
}

func (d *cDevice) close() {
	if d != nil && d.p != nil {
		C.cpg_device_close(d.p)
		d.p = nil
	}
}

// cCtx is one Gloo context (a full mesh of connections). Used by one goroutine at a time,
// which lets its collectives share one message buffer instead of allocating one per call.
type cCtx struct {
	p   *C.cpg_ctx
	err [errLen]C.char // the message of the last failed collective
}

func newCtx(s *cStore, prefix string, rank, size int, d *cDevice, timeout time.Duration) (*cCtx, error) {
	cp := C.CString(prefix)
	defer C.free(unsafe.Pointer(cp))
	var c *C.cpg_ctx
	buf := make([]C.char, errLen)
	if err := check(C.cpg_ctx_new(s.p, cp, C.int(rank), C.int(size), d.p, millis(timeout), &c, &buf[0], errLen), buf); err != nil {
		return nil, err
	}
	return &cCtx{p: c}, nil
}

func (c *cCtx) close() {
	if c != nil && c.p != nil {
		C.cpg_ctx_close(c.p)
		c.p = nil
	}
}

// allReduce runs even for an empty vals: the shim exchanges its frame, so that members that
// disagree on the length fail with a mismatch instead of one returning alone.
func (c *cCtx) allReduce(op int, vals []int64, timeout time.Duration) error {
	var p *C.int64_t
	if len(vals) > 0 {
		p = (*C.int64_t)(unsafe.Pointer(&vals[0]))
	}
	return check(C.cpg_allreduce_i64(c.p, C.int(op), p, C.size_t(len(vals)), millis(timeout), &c.err[0], errLen), c.err[:])
}

func (c *cCtx) broadcast(root int, data []byte, timeout time.Duration) ([]byte, error) {
	var out unsafe.Pointer
	var n C.size_t
	if err := check(C.cpg_broadcast(c.p, C.int(root), cbytes(data), C.size_t(len(data)), millis(timeout), &out, &n, &c.err[0], errLen), c.err[:]); err != nil {
		return nil, err
	}
	defer C.cpg_free(out)
	return C.GoBytes(out, C.int(n)), nil
}

func (c *cCtx) allGather(data []byte, size int, timeout time.Duration) ([][]byte, error) {
	var out unsafe.Pointer
	var lens *C.size_t
	if err := check(C.cpg_allgather(c.p, cbytes(data), C.size_t(len(data)), millis(timeout), &out, &lens, &c.err[0], errLen), c.err[:]); err != nil {
		return nil, err
	}
	defer C.cpg_free(out)
	defer C.cpg_free(unsafe.Pointer(lens))
	ls := unsafe.Slice((*C.size_t)(lens), size)
	total := 0
	for _, l := range ls {
		total += int(l)
	}
	all := C.GoBytes(out, C.int(total))
	parts := make([][]byte, size)
	off := 0
	for r, l := range ls {
		parts[r] = all[off : off+int(l) : off+int(l)]
		off += int(l)
	}
	return parts, nil
}

func (c *cCtx) barrier(timeout time.Duration) error {
	return check(C.cpg_barrier(c.p, millis(timeout), &c.err[0], errLen), c.err[:])
}

// cbytes returns a pointer to b's first byte, or nil for an empty slice. The shim copies
// the data during the call and keeps no reference.
func cbytes(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// Reduce op codes of the shim.
const (
	opMin = int(C.CPG_MIN)
	opMax = int(C.CPG_MAX)
	opSum = int(C.CPG_SUM)
)

// Shim result codes.
const (
	codeTimeout  = int(C.CPG_TIMEOUT)
	codeIO       = int(C.CPG_IO)
	codeInvalid  = int(C.CPG_INVALID)
	codeMismatch = int(C.CPG_MISMATCH)
)
