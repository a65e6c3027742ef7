// Package cuda is cpcache's binding of the CUDA driver API, loaded at run time.
//
// libcuda.so.1 is opened with dlopen when Open is called (CPCACHE_CUDA_LIBRARY overrides the
// path), so every binary builds and starts on machines without CUDA and fails with a clear
// *LoadError only when GPU work is asked for. The C half is csrc/cuda_loader.c: a table of
// entry points resolved at open time (missing ones are reported by name with the first CUDA
// release that has them) and thin trampolines. The _v2 entry points are used wherever they
// exist; no CUDA header is needed to build.
//
// Threading: every call that acts on a device makes the device's retained primary context
// current on the calling OS thread inside the same C call, so goroutines may migrate between
// threads and no runtime.LockOSThread is needed. (Device.MakeCurrent exists only for code
// that hands the thread to another CUDA library, e.g. NCCL, under LockOSThread.)
//
// Ownership: Open returns a *Driver; Driver.Device retains a device's primary context;
// buffers (Alloc, AllocHost, RegisterHost, OpenIPC), streams and events are made from a
// Device. Each object has a nil-safe, idempotent Close; close children before their Device
// and devices before their Driver. Once the driver has been initialised the library stays
// mapped until the process exits (unloading a live driver is unsafe); Close still balances
// the reference count.
//
// A typical transfer loop (what hicache's transfer engine does):
//
//	drv, err := cuda.Open()               // *LoadError on a machine without CUDA
//	dev, err := drv.Device(0)
//	pool, err := dev.Alloc(n)             // device KV pool (DevicePtr arithmetic by offset)
//	reg, err := dev.RegisterHost(shmSlab) // pin an mmap'd shared-memory slab
//	s, err := dev.NewStream()
//	s.CopyBatch([]cuda.Copy1{{Dst: reg.DevicePtr().Add(off), Src: pool.Ptr().Add(p), Size: page}, ...})
//	ev, err := dev.NewEvent(cuda.EventDisableTiming)
//	ev.Record(s) // later: ev.Query() polls without blocking the scheduler
//
// Errors: a failed driver call is an *Error carrying the entry point, the CUresult (also
// matchable with errors.Is(err, cuda.ErrorOutOfMemory)), the driver's name and message, and
// what the call was about.
//
// Topology (QueryTopology) comes from NVML through github.com/NVIDIA/go-nvml, which also
// dlopens its library; without it QueryTopology returns ErrNVMLUnavailable.
package cuda
