package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc -O2
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "cuda_api.h"
*/
import "C"

import "unsafe"

// cuCall names the driver entry point behind each trampoline, for error messages.
const (
	callInit           = "cuInit"
	callVersion        = "cuDriverGetVersion"
	callDeviceCount    = "cuDeviceGetCount"
	callDeviceGet      = "cuDeviceGet"
	callDeviceName     = "cuDeviceGetName"
	callTotalMem       = "cuDeviceTotalMem_v2"
	callAttribute      = "cuDeviceGetAttribute"
	callPCIBusID       = "cuDeviceGetPCIBusId"
	callCtxRetain      = "cuDevicePrimaryCtxRetain"
	callCtxRelease     = "cuDevicePrimaryCtxRelease_v2"
	callCtxSetCurrent  = "cuCtxSetCurrent"
	callCtxSync        = "cuCtxSynchronize"
	callMemGetInfo     = "cuMemGetInfo_v2"
	callMemAlloc       = "cuMemAlloc_v2"
	callMemFree        = "cuMemFree_v2"
	callHostAlloc      = "cuMemHostAlloc"
	callFreeHost       = "cuMemFreeHost"
	callHostRegister   = "cuMemHostRegister_v2"
	callHostUnregister = "cuMemHostUnregister"
	callHostDevPtr     = "cuMemHostGetDevicePointer_v2"
	callHtoD           = "cuMemcpyHtoD_v2"
	callDtoH           = "cuMemcpyDtoH_v2"
	callDtoD           = "cuMemcpyDtoD_v2"
	callHtoDAsync      = "cuMemcpyHtoDAsync_v2"
	callDtoHAsync      = "cuMemcpyDtoHAsync_v2"
	callDtoDAsync      = "cuMemcpyDtoDAsync_v2"
	callMemcpyAsync    = "cuMemcpyAsync"
	callMemset         = "cuMemsetD8_v2"
	callMemsetAsync    = "cuMemsetD8Async"
	callStreamCreate   = "cuStreamCreate"
	callStreamDestroy  = "cuStreamDestroy_v2"
	callStreamSync     = "cuStreamSynchronize"
	callStreamQuery    = "cuStreamQuery"
	callStreamWait     = "cuStreamWaitEvent"
	callEventCreate    = "cuEventCreate"
	callEventDestroy   = "cuEventDestroy_v2"
	callEventRecord    = "cuEventRecord"
	callEventSync      = "cuEventSynchronize"
	callEventQuery     = "cuEventQuery"
	callEventElapsed   = "cuEventElapsedTime"
	callIpcGetMem      = "cuIpcGetMemHandle"
	callIpcOpenMem     = "cuIpcOpenMemHandle_v2"
	callIpcCloseMem    = "cuIpcCloseMemHandle"
	callIpcGetEvent    = "cuIpcGetEventHandle"
	callIpcOpenEvent   = "cuIpcOpenEventHandle"
	callBatch          = "cuMemcpyBatchAsync"
)

// Flag bits the C trampolines or into a CUresult (see csrc/cuda_api.h).
const (
	ctxFailedBit = int(C.CP_CTX_FAILED)
	notLoadedBit = int(C.CP_NOT_LOADED)
)

// IPCHandleSize is the size of CUipcMemHandle and CUipcEventHandle (CU_IPC_HANDLE_SIZE).
const IPCHandleSize = int(C.CP_CU_IPC_HANDLE_SIZE)

// abiSizes reports the sizes of the C declarations, for the ABI tests.
func abiSizes() (ipcMem, ipcEvent, memcpyAttrs, devptr int) {
	return int(unsafe.Sizeof(C.cp_CUipcMemHandle{})), int(unsafe.Sizeof(C.cp_CUipcEventHandle{})),
		int(unsafe.Sizeof(C.cp_CUmemcpyAttributes{})), int(unsafe.Sizeof(C.cp_CUdeviceptr(0)))
}

// symbols lists the driver entry points the loader resolves, with the first CUDA release
// that has each and whether it is optional.
func symbols() []Symbol {
	n := int(C.cp_cuda_symbol_count())
	out := make([]Symbol, 0, n)
	for i := 0; i < n; i++ {
		var name, since *C.char
		var opt C.int
		if C.cp_cuda_symbol(C.int(i), &name, &since, &opt) != 0 {
			break
		}
		out = append(out, Symbol{Name: C.GoString(name), Since: C.GoString(since), Optional: opt != 0})
	}
	return out
}

// Symbol is one entry point of a run-time loaded library.
type Symbol struct {
	Name     string // exported name, e.g. "cuMemAlloc_v2"
	Since    string // first release that has it, e.g. "CUDA 3.2"
	Optional bool   // absent on older libraries; the feature falls back or reports unsupported
}
