package cuda

/*
#include "cuda_api.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// Result is a CUresult. It implements error so that errors.Is(err, cuda.ErrorNotReady) works
// on any *Error returned by this package.
type Result int

// CUresult values this package names or tests for (an ABI fact of cuda.h).
const (
	Success                          Result = 0
	ErrorInvalidValue                Result = 1
	ErrorOutOfMemory                 Result = 2
	ErrorNotInitialized              Result = 3
	ErrorDeinitialized               Result = 4
	ErrorStubLibrary                 Result = 34
	ErrorNoDevice                    Result = 100
	ErrorInvalidDevice               Result = 101
	ErrorInvalidContext              Result = 201
	ErrorAlreadyMapped               Result = 208
	ErrorPeerAccessUnsupported       Result = 217
	ErrorInvalidHandle               Result = 400
	ErrorNotFound                    Result = 500
	ErrorNotReady                    Result = 600
	ErrorIllegalAddress              Result = 700
	ErrorHostMemoryAlreadyRegistered Result = 712
	ErrorHostMemoryNotRegistered     Result = 713
	ErrorNotSupported                Result = 801
	ErrorUnknown                     Result = 999
)

// resultNames are the cuda.h names of the values above, used when the driver cannot be asked.
var resultNames = map[Result]string{
	Success:                          "CUDA_SUCCESS",
	ErrorInvalidValue:                "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory:                 "CUDA_ERROR_OUT_OF_MEMORY",
	ErrorNotInitialized:              "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized:               "CUDA_ERROR_DEINITIALIZED",
	ErrorStubLibrary:                 "CUDA_ERROR_STUB_LIBRARY",
	ErrorNoDevice:                    "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice:               "CUDA_ERROR_INVALID_DEVICE",
	ErrorInvalidContext:              "CUDA_ERROR_INVALID_CONTEXT",
	ErrorAlreadyMapped:               "CUDA_ERROR_ALREADY_MAPPED",
	ErrorPeerAccessUnsupported:       "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	ErrorInvalidHandle:               "CUDA_ERROR_INVALID_HANDLE",
	ErrorNotFound:                    "CUDA_ERROR_NOT_FOUND",
	ErrorNotReady:                    "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress:              "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrorHostMemoryAlreadyRegistered: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	ErrorHostMemoryNotRegistered:     "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	ErrorNotSupported:                "CUDA_ERROR_NOT_SUPPORTED",
	ErrorUnknown:                     "CUDA_ERROR_UNKNOWN",
}

// Name is the cuda.h name of r ("CUDA_ERROR_OUT_OF_MEMORY"), asked of the driver when it is
// loaded, else from this package's table, else "CUresult(N)".
func (r Result) Name() string {
	if s := C.cp_cuErrorName(C.int(r)); s != nil {
		return C.GoString(s)
	}
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int(r))
}

func (r Result) Error() string { return fmt.Sprintf("cuda: %s (%d)", r.Name(), int(r)) }

// Error is a failed driver call: which entry point, the CUresult, and the driver's message.
type Error struct {
	Call    string // driver entry point, e.g. "cuMemAlloc_v2"
	Code    Result // the CUresult
	Name    string // "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // the driver's description, "out of memory"
	Detail  string // what the call was about, e.g. "device 0, 1048576 bytes" (may be empty)
}

func (e *Error) Error() string {
	call := e.Call
	if e.Detail != "" {
		call += " (" + e.Detail + ")"
	}
	msg := e.Message
	if msg == "" {
		msg = "failed"
	}
	return fmt.Sprintf("cuda: %s: %s [%s = %d]", call, msg, e.Name, int(e.Code))
}

// Is matches a Result: errors.Is(err, cuda.ErrorOutOfMemory).
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Code
}

// ErrNotLoaded is returned by calls made before Open succeeded (or after the last Close).
var ErrNotLoaded = errors.New("cuda: driver library not loaded")

// ErrClosed is returned by methods of a closed Device, buffer, stream or event.
var ErrClosed = errors.New("cuda: use of closed object")

// check turns a trampoline's return value into an error naming call and detail.
func check(rc C.int, call, detail string) error {
	code := int(rc)
	if code == 0 {
		return nil
	}
	if code&notLoadedBit != 0 {
		return fmt.Errorf("cuda: %s: %w", call, ErrNotLoaded)
	}
	if code&ctxFailedBit != 0 {
		code &^= ctxFailedBit
		detail = "making the device's context current for " + call + joinDetail(detail)
		call = callCtxSetCurrent
	}
	return newError(call, Result(code), detail)
}

func joinDetail(d string) string {
	if d == "" {
		return ""
	}
	return ", " + d
}

func newError(call string, code Result, detail string) *Error {
	msg := ""
	if s := C.cp_cuErrorString(C.int(code)); s != nil {
		msg = C.GoString(s)
	}
	return &Error{Call: call, Code: code, Name: code.Name(), Message: msg, Detail: detail}
}
