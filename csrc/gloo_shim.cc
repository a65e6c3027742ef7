// gloo_shim.cc — implementation of gloo_shim.h. Every extern "C" entry point runs its body
// inside guard(), which turns any exception into a CPG_* code and a message.
#include "gloo_shim.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <gloo/transport/tcp/device.h>

namespace cpgshim {

// Stores that can also replace a key (Gloo's own set refuses existing keys).
class OverwritableStore {
 public:
  virtual ~OverwritableStore() = default;
  virtual gloo::rendezvous::Store& store() = 0;
  virtual void overwrite(const std::string& key, const std::vector<char>& data) = 0;
};

class FileStoreX : public gloo::rendezvous::FileStore, public OverwritableStore {
 public:
  explicit FileStoreX(const std::string& dir) : FileStore(dir) {}
  gloo::rendezvous::Store& store() override { return *this; }
  void overwrite(const std::string& key, const std::vector<char>& data) override {
    // FileStore::set writes a temporary file and renames it over the key's path, but
    // refuses when the path exists; remove it first (readers just wait a little longer).
    ::unlink(objectPath(key).c_str());
    set(key, data);
  }
};

class RedisStoreX : public gloo::rendezvous::RedisStore, public OverwritableStore {
 public:
  RedisStoreX(const std::string& host, int port) : RedisStore(host, port) {}
  gloo::rendezvous::Store& store() override { return *this; }
  void overwrite(const std::string& key, const std::vector<char>& data) override {
    void* ptr = redisCommand(redis_, "SET %b %b", key.c_str(), (size_t)key.size(), data.data(),
                             (size_t)data.size());
    if (ptr == nullptr) {
      GLOO_THROW_IO_EXCEPTION("redis SET ", key, ": ", redis_->errstr);
    }
    auto* reply = static_cast<redisReply*>(ptr);
    bool ok = reply->type == REDIS_REPLY_STATUS;
    std::string msg = reply->type == REDIS_REPLY_ERROR ? std::string(reply->str, reply->len) : "";
    freeReplyObject(reply);
    if (!ok) {
      GLOO_THROW_IO_EXCEPTION("redis SET ", key, " failed: ", msg);
    }
  }
};

struct Fail {
  int code;
  std::string msg;
};

void put(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) return;
  size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = 0;
}

bool isTimeout(const std::string& msg) {
  return msg.find("Timed out") != std::string::npos || msg.find("imeout") != std::string::npos;
}

// guard runs fn and maps exceptions to codes. fn returns CPG_OK or throws.
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

std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v < 1 ? 1 : v); }

void* dupBytes(const void* p, size_t n) {
  void* out = std::malloc(n == 0 ? 1 : n);
  if (out == nullptr) throw std::bad_alloc();
  if (n > 0) std::memcpy(out, p, n);
  return out;
}

}  // namespace cpgshim

using namespace cpgshim;

struct cpg_store {
  std::unique_ptr<OverwritableStore> s;
};

struct cpg_device {
  std::shared_ptr<gloo::transport::Device> dev;
};

struct cpg_ctx {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::shared_ptr<gloo::transport::Device> dev;  // keeps the device alive
  // Buffers of operations that failed: a late message may still target them, so they live
  // until the context's connections are closed.
  std::vector<std::shared_ptr<std::vector<char>>> graveyard;
  bool dead = false;  // connections closed after an I/O error
};

namespace {

// finish records a failed operation: keeps its buffers and, on an I/O error, closes every
// connection so that peers blocked on this rank fail promptly instead of at their deadline.
int finish(cpg_ctx* c, int code, std::initializer_list<std::shared_ptr<std::vector<char>>> bufs) {
  if (code == CPG_OK) return code;
  for (auto& b : bufs) {
    if (b) c->graveyard.push_back(b);
  }
  if (code == CPG_IO && !c->dead) {
    c->dead = true;
    try {
      c->ctx->closeConnections();
    } catch (...) {
    }
  }
  return code;
}

std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() < 1) {
    throw Fail{CPG_TIMEOUT, "deadline passed between phases"};
  }
  return left;
}

}  // namespace

extern "C" {

void cpg_free(void* p) { std::free(p); }

int cpg_store_file(const char* dir, cpg_store** out, char* err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (dir == nullptr || *dir == 0) throw Fail{CPG_INVALID, "empty store directory"};
    auto s = std::make_unique<cpg_store>();
    s->s = std::make_unique<FileStoreX>(dir);
    *out = s.release();
    return CPG_OK;
  });
}

int cpg_store_redis(const char* host, int port, cpg_store** out, char* err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (host == nullptr || *host == 0) throw Fail{CPG_INVALID, "empty redis host"};
    if (port <= 0 || port > 65535) {
      throw Fail{CPG_INVALID, "redis port " + std::to_string(port) + " out of range"};
    }
    auto s = std::make_unique<cpg_store>();
    s->s = std::make_unique<RedisStoreX>(host, port);
    *out = s.release();
    return CPG_OK;
  });
}

int cpg_store_set(cpg_store* s, const char* key, const void* data, size_t n, int overwrite,
                  char* err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (s == nullptr) throw Fail{CPG_INVALID, "nil store"};
    std::vector<char> v(static_cast<const char*>(data), static_cast<const char*>(data) + n);
    if (overwrite) {
      s->s->overwrite(key, v);
    } else {
      s->s->store().set(key, v);
    }
    return CPG_OK;
  });
}

int cpg_store_get(cpg_store* s, const char* key, int64_t timeout_ms, void** data, size_t* n,
                  char* err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (s == nullptr) throw Fail{CPG_INVALID, "nil store"};
    s->s->store().wait({key}, ms(timeout_ms));
    auto v = s->s->store().get(key);
    *data = dupBytes(v.data(), v.size());
    *n = v.size();
    return CPG_OK;
  });
}

void cpg_store_close(cpg_store* s) {
  try {
    delete s;
  } catch (...) {
  }
}

int cpg_device_new(const char* hostname, const char* iface, cpg_device** out, char* err,
                   size_t errlen) {
  return guard(err, errlen, [&] {
    gloo::transport::tcp::attr attr;
    if (iface != nullptr && *iface != 0) {
      attr.iface = iface;
    } else if (hostname != nullptr && *hostname != 0) {
      attr.hostname = hostname;
    }
    auto d = std::make_unique<cpg_device>();
    d->dev = gloo::transport::tcp::CreateDevice(attr);
    *out = d.release();
    return CPG_OK;
  });
}

int cpg_device_str(cpg_device* d, char* buf, size_t buflen) {
  return guard(buf, buflen, [&] {
    if (d == nullptr) throw Fail{CPG_INVALID, "nil device"};
    put(buf, buflen, d->dev->str());
    return CPG_OK;
  });
}

void cpg_device_close(cpg_device* d) {
  try {
    delete d;
  } catch (...) {
  }
}

int cpg_ctx_new(cpg_store* s, const char* prefix, int rank, int size, cpg_device* d,
                int64_t timeout_ms, cpg_ctx** out, char* err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (s == nullptr || d == nullptr) throw Fail{CPG_INVALID, "nil store or device"};
    if (size < 1 || rank < 0 || rank >= size) {
      throw Fail{CPG_INVALID, "rank " + std::to_string(rank) + " of size " + std::to_string(size)};
    }
    auto c = std::make_unique<cpg_ctx>();
    c->dev = d->dev;
    c->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    c->ctx->setTimeout(ms(timeout_ms));
    gloo::rendezvous::PrefixStore ps(prefix, s->s->store());
    c->ctx->connectFullMesh(ps, c->dev);
    *out = c.release();
    return CPG_OK;
  });
}

void cpg_ctx_close(cpg_ctx* c) {
  if (c == nullptr) return;
  try {
    if (!c->dead) c->ctx->closeConnections();
  } catch (...) {
  }
  try {
    delete c;
  } catch (...) {
  }
}

int cpg_allreduce_i64(cpg_ctx* c, int op, int64_t* vals, size_t n, int64_t timeout_ms,
                      char* err, size_t errlen) {
  std::shared_ptr<std::vector<char>> buf;
  int code = guard(err, errlen, [&] {
    if (c == nullptr) throw Fail{CPG_INVALID, "nil context"};
    if (c->dead) throw Fail{CPG_IO, "context closed after an earlier I/O error"};
    gloo::AllreduceOptions::Func fn;
    switch (op) {
      case CPG_MIN:
        fn = [](void* a, const void* b, const void* d, size_t k) { gloo::min<int64_t>(a, b, d, k); };
        break;
      case CPG_MAX:
        fn = [](void* a, const void* b, const void* d, size_t k) { gloo::max<int64_t>(a, b, d, k); };
        break;
      case CPG_SUM:
        fn = [](void* a, const void* b, const void* d, size_t k) { gloo::sum<int64_t>(a, b, d, k); };
        break;
      default:
        throw Fail{CPG_INVALID, "unknown reduce op " + std::to_string(op)};
    }
    if (n == 0) return CPG_OK;
    buf = std::make_shared<std::vector<char>>(n * sizeof(int64_t));
    std::memcpy(buf->data(), vals, n * sizeof(int64_t));
    gloo::AllreduceOptions o(c->ctx);
    o.setOutput(reinterpret_cast<int64_t*>(buf->data()), n);
    o.setReduceFunction(fn);
    o.setTimeout(ms(timeout_ms));
    gloo::allreduce(o);
    std::memcpy(vals, buf->data(), n * sizeof(int64_t));
    return CPG_OK;
  });
  return c == nullptr ? code : finish(c, code, {buf});
}

int cpg_broadcast(cpg_ctx* c, int root, const void* in, size_t n, int64_t timeout_ms,
                  void** out, size_t* outlen, char* err, size_t errlen) {
  std::shared_ptr<std::vector<char>> lenbuf, buf;
  int code = guard(err, errlen, [&] {
    if (c == nullptr) throw Fail{CPG_INVALID, "nil context"};
    if (c->dead) throw Fail{CPG_IO, "context closed after an earlier I/O error"};
    if (root < 0 || root >= c->ctx->size) {
      throw Fail{CPG_INVALID, "root " + std::to_string(root) + " out of range"};
    }
    auto deadline = std::chrono::steady_clock::now() + ms(timeout_ms);
    const bool isRoot = c->ctx->rank == root;
    // Phase 1: the length, so that non-roots can size their buffer.
    lenbuf = std::make_shared<std::vector<char>>(sizeof(int64_t));
    int64_t len = isRoot ? static_cast<int64_t>(n) : 0;
    std::memcpy(lenbuf->data(), &len, sizeof len);
    if (c->ctx->size > 1) {
      gloo::BroadcastOptions o(c->ctx);
      o.setRoot(root);
      if (isRoot) o.setInput(reinterpret_cast<int64_t*>(lenbuf->data()), 1);
      o.setOutput(reinterpret_cast<int64_t*>(lenbuf->data()), 1);
      o.setTimeout(remaining(deadline));
      gloo::broadcast(o);
    }
    std::memcpy(&len, lenbuf->data(), sizeof len);
    if (len < 0) throw Fail{CPG_ERROR, "negative broadcast length " + std::to_string(len)};
    // Phase 2: the data.
    buf = std::make_shared<std::vector<char>>(static_cast<size_t>(len));
    if (isRoot && len > 0) std::memcpy(buf->data(), in, static_cast<size_t>(len));
    if (len > 0 && c->ctx->size > 1) {
      gloo::BroadcastOptions o(c->ctx);
      o.setRoot(root);
      if (isRoot) o.setInput(buf->data(), static_cast<size_t>(len));
      o.setOutput(buf->data(), static_cast<size_t>(len));
      o.setTimeout(remaining(deadline));
      gloo::broadcast(o);
    }
    *out = dupBytes(buf->data(), buf->size());
    *outlen = buf->size();
    return CPG_OK;
  });
  return c == nullptr ? code : finish(c, code, {lenbuf, buf});
}

int cpg_allgather(cpg_ctx* c, const void* in, size_t n, int64_t timeout_ms, void** out,
                  size_t** lens, char* err, size_t errlen) {
  std::shared_ptr<std::vector<char>> inbuf, lenbuf, buf;
  int code = guard(err, errlen, [&] {
    if (c == nullptr) throw Fail{CPG_INVALID, "nil context"};
    if (c->dead) throw Fail{CPG_IO, "context closed after an earlier I/O error"};
    auto deadline = std::chrono::steady_clock::now() + ms(timeout_ms);
    const size_t size = static_cast<size_t>(c->ctx->size);
    // Phase 1: every member's length.
    // lenbuf holds the gathered lengths followed by this member's own (the input).
    lenbuf = std::make_shared<std::vector<char>>((size + 1) * sizeof(int64_t));
    int64_t mine = static_cast<int64_t>(n);
    std::memcpy(lenbuf->data() + size * sizeof(int64_t), &mine, sizeof mine);
    std::vector<int64_t> lens64(size);
    if (size > 1) {
      gloo::AllgathervOptions o(c->ctx);
      o.setInput(reinterpret_cast<int64_t*>(lenbuf->data()) + size, 1);
      o.setOutput(reinterpret_cast<int64_t*>(lenbuf->data()), std::vector<size_t>(size, 1));
      o.setTimeout(remaining(deadline));
      gloo::allgatherv(o);
      std::memcpy(lens64.data(), lenbuf->data(), size * sizeof(int64_t));
    } else {
      lens64[0] = mine;
    }
    size_t total = 0;
    std::vector<size_t> counts(size);
    for (size_t r = 0; r < size; r++) {
      if (lens64[r] < 0) throw Fail{CPG_ERROR, "negative allgather length from rank " + std::to_string(r)};
      counts[r] = static_cast<size_t>(lens64[r]);
      total += counts[r];
    }
    // Phase 2: the data, concatenated in rank order.
    inbuf = std::make_shared<std::vector<char>>(n);
    if (n > 0) std::memcpy(inbuf->data(), in, n);
    buf = std::make_shared<std::vector<char>>(total);
    if (total > 0) {
      if (size > 1) {
        gloo::AllgathervOptions o(c->ctx);
        o.setInput(inbuf->data(), n);
        o.setOutput(buf->data(), counts);
        o.setTimeout(remaining(deadline));
        gloo::allgatherv(o);
      } else {
        std::memcpy(buf->data(), inbuf->data(), n);
      }
    }
    auto* l = static_cast<size_t*>(std::malloc(size * sizeof(size_t)));
    if (l == nullptr) throw std::bad_alloc();
    std::memcpy(l, counts.data(), size * sizeof(size_t));
    void* o = nullptr;
    try {
      o = dupBytes(buf->data(), total);
    } catch (...) {
      std::free(l);
      throw;
    }
    *out = o;
    *lens = l;
    return CPG_OK;
  });
  return c == nullptr ? code : finish(c, code, {inbuf, lenbuf, buf});
}

int cpg_barrier(cpg_ctx* c, int64_t timeout_ms, char* err, size_t errlen) {
  int code = guard(err, errlen, [&] {
    if (c == nullptr) throw Fail{CPG_INVALID, "nil context"};
    if (c->dead) throw Fail{CPG_IO, "context closed after an earlier I/O error"};
    if (c->ctx->size == 1) return CPG_OK;
    gloo::BarrierOptions o(c->ctx);
    o.setTimeout(ms(timeout_ms));
    gloo::barrier(o);
    return CPG_OK;
  });
  return c == nullptr ? code : finish(c, code, {});
}

}  // extern "C"
