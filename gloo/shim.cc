// Compiles the Gloo C ABI shim from csrc/ into this package, so that `go build` needs no
// separate build step.
#include "../csrc/gloo_shim.cc"
