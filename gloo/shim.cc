// Compiles the Gloo C ABI shim (stores, devices, contexts) from csrc/ into this package, so
// that `go build` needs no separate build step.
//
// The go command does not notice edits to files #included from outside the package, so the
// digest below names the csrc/gloo_* content this package was last built from; TestShimDigest
// fails (printing the new line) when csrc changed, and updating the line makes Go rebuild the
// whole package (collectives.cc included).
// csrc-digest: 0f5d33078f61b4bf
#include "../csrc/gloo_shim.cc"
