/* loader_status.h — status codes of the run-time library loaders (see loader.h). */
#ifndef CPCACHE_LOADER_STATUS_H
#define CPCACHE_LOADER_STATUS_H
enum {
  CP_LOAD_OK = 0,
  CP_LOAD_NO_LIBRARY = 1,     /* no candidate could be dlopen'ed */
  CP_LOAD_MISSING_SYMBOL = 2, /* a candidate opened, but required symbols are missing */
  CP_LOAD_BAD_ARGUMENT = 3
};
#endif
