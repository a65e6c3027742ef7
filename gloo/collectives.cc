// Go does not rebuild cgo code when an included file outside the package changes: bump
// this revision with every edit of csrc/gloo_* (or build with -a). Revision: 4.
// Compiles the shim's collectives from csrc/ into this package.
#include "../csrc/gloo_collectives.cc"
