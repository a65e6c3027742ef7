// Compiles csrc/cpcache_capi.c (the public entry points with their fork check, the
// thread-local last error, static strings) into libcpcache. The go command does not notice
// edits to files #included from outside the package: touch this file (or build with -a)
// after editing csrc/cpcache_capi.* or csrc/cpcache_entries.h.
#include "../../csrc/cpcache_capi.c"
