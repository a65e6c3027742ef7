// gloo_shim_internal.h — what the shim's translation units share: the handle types, the
// exception guard and deadline helpers. Not part of the C ABI.
#ifndef CPCACHE_GLOO_SHIM_INTERNAL_H
#define CPCACHE_GLOO_SHIM_INTERNAL_H

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include "gloo_shim.h"

struct cpg_ctx {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::shared_ptr<gloo::transport::Device> dev;  // keeps the device alive
  uint64_t seq = 0;                              // collectives started (slot of the next)
  int directMax = 32;  // groups up to this size use the direct exchange (CPCACHE_GLOO_DIRECT_MAX)
  // Buffers (memory and Gloo buffer objects) of operations that failed: a late message may
  // still target them, so they live until the context is freed. Declared after ctx so that
  // they are destroyed first.
  std::vector<std::shared_ptr<void>> graveyard;
  bool dead = false;  // connections closed after an I/O error
};

namespace cpgshim {

// Fail is thrown inside guard() to return a specific code and message.
struct Fail {
  int code;
  std::string msg;
};

inline void put(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) return;
  size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = 0;
}

inline bool isTimeout(const std::string& msg) {
  return msg.find("Timed out") != std::string::npos || msg.find("imeout") != std::string::npos;
}

// guard runs fn (which returns CPG_OK or throws) and maps exceptions to codes and messages.
template <typename F>
int guard(char* err, size_t errlen, F&& fn) {
  int code = CPG_OK;
  std::string msg;
  try {
    code = fn();
  } catch (const Fail& f) {
    code = f.code;
    msg = f.msg;
  } catch (const gloo::IoException& e) {
    msg = e.what();
    code = isTimeout(msg) ? CPG_TIMEOUT : CPG_IO;
  } catch (const gloo::EnforceNotMet& e) {
    msg = e.what();
    code = CPG_ERROR;
  } catch (const std::bad_alloc&) {
    msg = "out of memory";
    code = CPG_ERROR;
  } catch (const std::exception& e) {
    msg = e.what();
    code = CPG_ERROR;
  } catch (...) {
    msg = "unknown C++ exception";
    code = CPG_ERROR;
  }
  if (code != CPG_OK) put(err, errlen, msg);
  return code;
}

inline std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v < 1 ? 1 : v); }

using Deadline = std::chrono::steady_clock::time_point;

inline Deadline deadlineIn(int64_t timeout_ms) { return std::chrono::steady_clock::now() + ms(timeout_ms); }

// remaining is the time left before deadline; it throws a timeout when none is.
inline std::chrono::milliseconds remaining(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() < 1) throw Fail{CPG_TIMEOUT, "Timed out: the deadline passed between phases"};
  return left;
}

inline void* dupBytes(const void* p, size_t n) {
  void* out = std::malloc(n == 0 ? 1 : n);
  if (out == nullptr) throw std::bad_alloc();
  if (n > 0) std::memcpy(out, p, n);
  return out;
}

}  // namespace cpgshim

#endif  // CPCACHE_GLOO_SHIM_INTERNAL_H
