// Compiles csrc/cpcache_capi.c (thread-local last error, static strings) into libcpcache.
// The go command does not notice edits to files #included from outside the package: touch
// this file (or build with -a) after editing csrc/cpcache_capi.*.
#include "../../csrc/cpcache_capi.c"
