// Go does not rebuild cgo code when an included file outside the package changes: bump
// this revision with every edit of csrc/gloo_* (or build with -a). Revision: 4.
// Compiles the Gloo C ABI shim (stores, devices, contexts) from csrc/ into this package, so
// that `go build` needs no separate build step.
#include "../csrc/gloo_shim.cc"
