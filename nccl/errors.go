package nccl

/*
#include "nccl_api.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Result is an ncclResult_t. It implements error, so errors.Is(err, nccl.InvalidUsage) works
// on any *Error of this package.
type Result int

// ncclResult_t values (an ABI fact of nccl.h).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
	"ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"}

// Name is the nccl.h name of r.
func (r Result) Name() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

func (r Result) Error() string { return fmt.Sprintf("nccl: %s (%d)", r.Name(), int(r)) }

// Error is a failed NCCL call.
type Error struct {
	Call      string // "ncclAllReduce"
	Code      Result
	Message   string // ncclGetErrorString
	LastError string // ncclGetLastError, when the library has it and says something
	Detail    string // what the call was about
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
	s := fmt.Sprintf("nccl: %s: %s [%s = %d]", call, msg, e.Code.Name(), int(e.Code))
	if e.LastError != "" {
		s += ": " + e.LastError
	}
	return s
}

// Is matches a Result.
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Code
}

var (
	// ErrNotLoaded: a call made before Open succeeded.
	ErrNotLoaded = errors.New("nccl: library not loaded")
	// ErrUnsupported: the loaded NCCL is too old for the call.
	ErrUnsupported = errors.New("nccl: not supported by this NCCL version")
	// ErrAborted: the communicator was aborted (after a timeout or an asynchronous error).
	ErrAborted = errors.New("nccl: communicator aborted")
	// ErrClosed: the communicator was destroyed.
	ErrClosed = errors.New("nccl: communicator closed")
)

// check turns a trampoline result into an error. comm (may be nil) is asked for its last
// error message.
func check(rc C.int, call, detail string, comm unsafe.Pointer) error {
	code := int(rc)
	if code == 0 {
		return nil
	}
	if code&notLoadedBit != 0 {
		return fmt.Errorf("nccl: %s: %w", call, ErrNotLoaded)
	}
	e := &Error{Call: call, Code: Result(code), Detail: detail}
	if s := C.cp_ncclGetErrorString(C.int(code)); s != nil {
		e.Message = C.GoString(s)
	}
	if s := C.cp_ncclGetLastError(comm); s != nil {
		e.LastError = C.GoString(s)
	}
	return e
}
