// Compiles the Gloo C ABI shim (stores, devices, contexts) from csrc/ into this package, so
// that `go build` needs no separate build step.
#include "../csrc/gloo_shim.cc"
