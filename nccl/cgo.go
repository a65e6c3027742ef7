package nccl

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc -O2
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "nccl_api.h"
*/
import "C"

import (
	"strings"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
)

// UniqueIDSize is sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES).
const UniqueIDSize = int(C.CP_NCCL_UNIQUE_ID_BYTES)

const notLoadedBit = int(C.CP_NCCL_NOT_LOADED)

// Optional entry points, by the index cp_nccl_has takes.
const (
	hasInitRankConfig = 0
	hasFinalize       = 1
	hasSplit          = 2
	hasGetLastError   = 3
)

// symbols lists the NCCL entry points the loader resolves.
func symbols() []cuda.Symbol {
	n := int(C.cp_nccl_symbol_count())
	out := make([]cuda.Symbol, 0, n)
	for i := 0; i < n; i++ {
		var name, since *C.char
		var opt C.int
		if C.cp_nccl_symbol(C.int(i), &name, &since, &opt) != 0 {
			break
		}
		out = append(out, cuda.Symbol{Name: C.GoString(name), Since: C.GoString(since), Optional: opt != 0})
	}
	return out
}

// configV21400 returns the bytes of the ncclConfig_t prefix this package sends, for tests.
func configV21400(blocking bool) []byte {
	var c C.cp_ncclConfig_v21400
	b := C.int(0)
	if blocking {
		b = 1
	}
	C.cp_nccl_config_v21400(&c, b)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&c)), unsafe.Sizeof(c))
	return append([]byte(nil), raw[:int(C.CP_NCCL_CONFIG_V21400_SIZE)]...)
}

func uniqueIDCSize() int { return int(unsafe.Sizeof(C.cp_ncclUniqueId{})) }

func cstr(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

// notLoadedCode is the value trampolines return when the library is not loaded (tests).
func notLoadedCode() C.int { return C.CP_NCCL_NOT_LOADED }
