package gloo

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../csrc/gloo_shim.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"time"
	"unsafe"
)

// The shim's store operations (cpg_store_ops): Gloo's rendezvous calls them, on the thread
// of the cgo call that runs it, to read and write its keys in this package's store. They
// never panic into C: a panic is a CPG_ERROR with its message.

// cbStore is the store a handle names.
func cbStore(h C.uintptr_t) *store { return cgo.Handle(h).Value().(*store) }

// cbFail writes err's message into the shim's buffer and returns its code.
func cbFail(err error, buf *C.char, n C.size_t) C.int {
	if n == 0 {
		return C.CPG_ERROR
	}
	msg := err.Error()
	if len(msg) > int(n)-1 {
		msg = msg[:n-1]
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	copy(b, msg)
	b[len(msg)] = 0
	if isTimeout(err) {
		return C.CPG_TIMEOUT
	}
	return C.CPG_ERROR
}

//export cpgoStoreSet
func cpgoStoreSet(h C.uintptr_t, key *C.char, klen C.size_t, data *C.char, n C.size_t, errBuf *C.char, errLen C.size_t) (rc C.int) {
	defer func() {
		if r := recover(); r != nil {
			rc = cbFail(fmt.Errorf("gloo: store set: panic: %v", r), errBuf, errLen)
		}
	}()
	k := C.GoStringN(key, C.int(klen))
	v := C.GoBytes(unsafe.Pointer(data), C.int(n))
	if err := cbStore(h).put(k, v); err != nil {
		return cbFail(err, errBuf, errLen)
	}
	return C.CPG_OK
}

//export cpgoStoreGet
func cpgoStoreGet(h C.uintptr_t, key *C.char, klen C.size_t, timeoutMs C.int64_t, data *unsafe.Pointer, n *C.size_t, errBuf *C.char, errLen C.size_t) (rc C.int) {
	defer func() {
		if r := recover(); r != nil {
			rc = cbFail(fmt.Errorf("gloo: store get: panic: %v", r), errBuf, errLen)
		}
	}()
	k := C.GoStringN(key, C.int(klen))
	timeout := time.Duration(-1)
	if timeoutMs >= 0 {
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	v, err := cbStore(h).wait(k, timeout)
	if err != nil {
		return cbFail(err, errBuf, errLen)
	}
	p := C.malloc(C.size_t(max(len(v), 1)))
	if p == nil {
		return cbFail(fmt.Errorf("gloo: store get %s: out of memory", k), errBuf, errLen)
	}
	if len(v) > 0 {
		C.memcpy(p, unsafe.Pointer(&v[0]), C.size_t(len(v)))
	}
	*data, *n = p, C.size_t(len(v))
	return C.CPG_OK
}
