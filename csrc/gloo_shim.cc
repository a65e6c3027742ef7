// gloo_shim.cc — stores, devices and contexts of gloo_shim.h. The collectives are in
// gloo_collectives.cc. Every extern "C" entry point runs its body inside guard(), which turns
// any exception into a CPG_* code and a message.
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <gloo/transport/tcp/device.h>

#include "gloo_shim_internal.h"

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

}  // namespace cpgshim

using namespace cpgshim;

struct cpg_store {
  std::unique_ptr<OverwritableStore> s;
};

struct cpg_device {
  std::shared_ptr<gloo::transport::Device> dev;
};

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
    if (const char* v = std::getenv("CPCACHE_GLOO_DIRECT_MAX")) {
      char* end = nullptr;
      errno = 0;
      long m = std::strtol(v, &end, 10);
      if (end == v || *end != 0 || m < 0 || m > INT_MAX || errno == ERANGE) {
        throw Fail{CPG_INVALID, std::string("CPCACHE_GLOO_DIRECT_MAX=\"") + v + "\" is not a non-negative integer"};
      }
      c->directMax = static_cast<int>(m);
    }
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

}  // extern "C"
