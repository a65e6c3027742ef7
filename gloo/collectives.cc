// Compiles the shim's collectives from csrc/ into this package. The csrc-digest line in
// shim.cc covers csrc/gloo_collectives.cc too (see TestShimDigest).
#include "../csrc/gloo_collectives.cc"
