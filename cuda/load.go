package cuda

/*
#include <stdlib.h>
#include "cuda_api.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// Sentinels for LoadError, usable with errors.Is.
var (
	// ErrLibraryNotFound: no candidate path could be opened.
	ErrLibraryNotFound = errors.New("library not found")
	// ErrMissingSymbol: the library opened but lacks required entry points (too old).
	ErrMissingSymbol = errors.New("library too old: missing symbols")
)

// LoadError reports why a run-time library could not be loaded.
type LoadError struct {
	Pkg     string   // "cuda" or "nccl", the message prefix
	Library string   // the default soname, "libcuda.so.1"
	Env     string   // the override variable, "CPCACHE_CUDA_LIBRARY"
	Tried   []string // candidate paths, in order
	Reason  error    // ErrLibraryNotFound or ErrMissingSymbol
	Detail  string   // dlerror messages per candidate, or the missing symbols with versions
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("%s: cannot load %s (%v; set %s to its path): %s",
		e.Pkg, e.Library, e.Reason, e.Env, e.Detail)
}

func (e *LoadError) Unwrap() error { return e.Reason }

// cstrings converts candidates to a C array; free with freeCStrings.
func cstrings(ss []string) (**C.char, func()) {
	arr := C.malloc(C.size_t(len(ss)+1) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	view := unsafe.Slice((**C.char)(arr), len(ss)+1)
	for i, s := range ss {
		view[i] = C.CString(s)
	}
	view[len(ss)] = nil
	return (**C.char)(arr), func() {
		for i := range ss {
			C.free(unsafe.Pointer(view[i]))
		}
		C.free(arr)
	}
}

// Driver is an open reference to the CUDA driver library. Open it with Open; Close drops the
// reference. Devices, buffers, streams and events must be closed before their Driver.
type Driver struct {
	path    string
	version int

	mu     sync.Mutex // protects closed
	closed bool
}

var openMu sync.Mutex // serialises Open/Close so cuInit and the reference count agree

// Open loads libcuda (CPCACHE_CUDA_LIBRARY, else libcuda.so.1 through the dynamic linker,
// else well-known directories), resolves every entry point, and initialises the driver.
// Each successful Open must be paired with Close. On a machine without the driver it returns
// a *LoadError; without a usable GPU, an *Error from cuInit (e.g. CUDA_ERROR_NO_DEVICE).
func Open() (*Driver, error) {
	return openWith(cudaSearch())
}

func openWith(s LibrarySearch) (*Driver, error) {
	openMu.Lock()
	defer openMu.Unlock()
	cands := s.Candidates()
	arr, free := cstrings(cands)
	defer free()
	errbuf := make([]byte, 8192)
	rc := C.cp_cuda_open(arr, C.int(len(cands)), (*C.char)(unsafe.Pointer(&errbuf[0])), C.size_t(len(errbuf)))
	if rc != C.CP_LOAD_OK {
		le := &LoadError{Pkg: "cuda", Library: s.Sonames[0], Env: s.Env, Tried: cands,
			Detail: cstr(errbuf), Reason: ErrLibraryNotFound}
		if rc == C.CP_LOAD_MISSING_SYMBOL {
			le.Reason = ErrMissingSymbol
		}
		return nil, le
	}
	if err := check(C.cp_cuInit(0), callInit, ""); err != nil {
		C.cp_cuda_close()
		return nil, err
	}
	// The driver is initialised: it now owns threads and global state, so the library must
	// stay mapped for the life of the process even after the last Close.
	C.cp_cuda_keep()
	var v C.int
	if err := check(C.cp_cuDriverGetVersion(&v), callVersion, ""); err != nil {
		C.cp_cuda_close()
		return nil, err
	}
	pathbuf := make([]byte, 4096)
	C.cp_cuda_path((*C.char)(unsafe.Pointer(&pathbuf[0])), C.size_t(len(pathbuf)))
	return &Driver{path: cstr(pathbuf), version: int(v)}, nil
}

func cstr(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

// Close drops this reference to the driver library. It is nil-safe and idempotent.
func (d *Driver) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	openMu.Lock()
	C.cp_cuda_close()
	openMu.Unlock()
	return nil
}

// Path is the file the driver library was loaded from.
func (d *Driver) Path() string { return d.path }

// Version is the driver's CUDA version as cuDriverGetVersion reports it (12080 = 12.8).
func (d *Driver) Version() int { return d.version }

// VersionString formats Version as "12.8".
func (d *Driver) VersionString() string { return FormatVersion(d.version) }

// FormatVersion formats a cuDriverGetVersion value: 12080 -> "12.8", 13000 -> "13.0".
func FormatVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10) }

// BatchCopyABI reports which batched-copy entry point the driver has: "" (none: copies run
// one by one), "cuMemcpyBatchAsync" (the CUDA 12.8 ABI) or "cuMemcpyBatchAsync_v2" (13.0).
// The driver keeps exporting the 12.8 symbol with its 12.8 signature, so it is preferred.
func (d *Driver) BatchCopyABI() string {
	if d.version < 12080 {
		return ""
	}
	switch C.cp_cuda_batch_abi() {
	case 1:
		return "cuMemcpyBatchAsync"
	case 2:
		if d.version >= 13000 {
			return "cuMemcpyBatchAsync_v2"
		}
	}
	return ""
}

func (d *Driver) live() error {
	if d == nil {
		return fmt.Errorf("cuda: nil driver: %w", ErrNotLoaded)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda: driver: %w", ErrClosed)
	}
	return nil
}

// DeviceCount is the number of CUDA devices visible to this process.
func (d *Driver) DeviceCount() (int, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	var n C.int
	if err := check(C.cp_cuDeviceGetCount(&n), callDeviceCount, ""); err != nil {
		return 0, err
	}
	return int(n), nil
}

// libraryLoaded reports whether libcuda is mapped now (tests).
func libraryLoaded() bool {
	buf := make([]byte, 4096)
	return C.cp_cuda_path((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))) != 0
}
