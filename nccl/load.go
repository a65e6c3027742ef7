package nccl

/*
#include <stdlib.h>
#include "nccl_api.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
)

// search is where libnccl.so.2 is looked for: CPCACHE_NCCL_LIBRARY (exclusively, when set),
// the soname through the dynamic linker, CUDA and NCCL install directories, then Python
// wheel layouts (site-packages/nvidia/nccl/lib, as installed with PyTorch).
func search() cuda.LibrarySearch {
	return cuda.LibrarySearch{
		Env:     "CPCACHE_NCCL_LIBRARY",
		Sonames: []string{"libnccl.so.2", "libnccl.so"},
		Dirs: []string{
			"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
			"/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/nccl/lib", "/opt/nccl/lib",
			"/usr/local/lib",
		},
		Globs: cuda.PythonLibGlobs("nvidia/nccl/lib/libnccl.so.2"),
	}
}

// Library is an open reference to libnccl. Close drops it; once a communicator has been
// created the library stays mapped until the process exits (NCCL keeps threads).
type Library struct {
	path    string
	version Version

	mu     sync.Mutex // protects closed
	closed bool
}

var openMu sync.Mutex // serialises Open/Close with the C reference count

// Open loads libnccl. Without it, it returns a *cuda.LoadError (errors.Is
// cuda.ErrLibraryNotFound or cuda.ErrMissingSymbol) whose message says what was tried.
func Open() (*Library, error) { return openWith(search()) }

func openWith(s cuda.LibrarySearch) (*Library, error) {
	openMu.Lock()
	defer openMu.Unlock()
	cands := s.Candidates()
	arr := C.malloc(C.size_t(len(cands)+1) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(arr)
	view := unsafe.Slice((**C.char)(arr), len(cands)+1)
	for i, c := range cands {
		view[i] = C.CString(c)
		defer C.free(unsafe.Pointer(view[i]))
	}
	view[len(cands)] = nil
	errbuf := make([]byte, 8192)
	rc := C.cp_nccl_open((**C.char)(arr), C.int(len(cands)), (*C.char)(unsafe.Pointer(&errbuf[0])), C.size_t(len(errbuf)))
	if rc != C.CP_LOAD_OK {
		le := &cuda.LoadError{Pkg: "nccl", Library: s.Sonames[0], Env: s.Env, Tried: cands,
			Detail: cstr(errbuf), Reason: cuda.ErrLibraryNotFound}
		if rc == C.CP_LOAD_MISSING_SYMBOL {
			le.Reason = cuda.ErrMissingSymbol
		}
		return nil, le
	}
	var v C.int
	if err := check(C.cp_ncclGetVersion(&v), "ncclGetVersion", "", nil); err != nil {
		C.cp_nccl_close()
		return nil, err
	}
	pathbuf := make([]byte, 4096)
	C.cp_nccl_path((*C.char)(unsafe.Pointer(&pathbuf[0])), C.size_t(len(pathbuf)))
	return &Library{path: cstr(pathbuf), version: Version(v)}, nil
}

// Close drops this reference. Nil-safe and idempotent.
func (l *Library) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	openMu.Lock()
	C.cp_nccl_close()
	openMu.Unlock()
	return nil
}

// Path is the file the library was loaded from.
func (l *Library) Path() string { return l.path }

// Version is the library's version.
func (l *Library) Version() Version { return l.version }

// Supports reports whether an optional feature is available: "config" (non-blocking
// communicators, ncclCommInitRankConfig and ncclCommFinalize, >= 2.14), "split"
// (ncclCommSplit, >= 2.18).
func (l *Library) Supports(feature string) bool {
	switch feature {
	case "config":
		return l.version.AtLeast(2, 14, 0) && C.cp_nccl_has(hasInitRankConfig) != 0 && C.cp_nccl_has(hasFinalize) != 0
	case "split":
		return l.version.AtLeast(2, 18, 0) && C.cp_nccl_has(hasSplit) != 0
	}
	return false
}

// UniqueID is an ncclUniqueId: 128 opaque bytes that name a communicator being created.
type UniqueID [UniqueIDSize]byte

// NewUniqueID asks NCCL for a fresh id (rank 0 does this and broadcasts it).
func (l *Library) NewUniqueID() (UniqueID, error) {
	var id UniqueID
	if err := l.live(); err != nil {
		return id, err
	}
	err := check(C.cp_ncclGetUniqueId(unsafe.Pointer(&id[0])), "ncclGetUniqueId", "", nil)
	return id, err
}

func (l *Library) live() error {
	if l == nil {
		return fmt.Errorf("nccl: nil library: %w", ErrNotLoaded)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("nccl: library closed: %w", ErrNotLoaded)
	}
	return nil
}
