// Compiles the shim's collectives from csrc/ into this package.
#include "../csrc/gloo_collectives.cc"
