// gloo_shim.cc — stores, devices and contexts of gloo_shim.h. The collectives are in
// gloo_collectives.cc. Every extern "C" entry point runs its body inside guard(), which turns
// any exception into a CPG_* code and a message.
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "gloo_shim_internal.h"

namespace cpgshim {

// CallbackStore is a Gloo store whose keys live in the caller's store (cpg_store_ops): the
// caller bounds and cancels every call, so that no store operation Gloo makes can block past
// the caller's deadline. A failed call throws Fail with the caller's code and message.
class CallbackStore : public gloo::rendezvous::Store {
 public:
  CallbackStore(const cpg_store_ops& ops, uintptr_t h) : ops_(ops), h_(h) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    char err[1024] = {0};
    int rc = ops_.set(h_, const_cast<char*>(key.data()), key.size(), const_cast<char*>(data.data()),
                      data.size(), err, sizeof err);
    if (rc != CPG_OK) throw Fail{rc, err};
  }

  std::vector<char> get(const std::string& key) override { return fetch(key, -1); }

  void wait(const std::vector<std::string>& keys) override { wait(keys, std::chrono::milliseconds(-1)); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    // One deadline for all keys; -1 leaves the bound to the caller's store.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& k : keys) {
      int64_t left = -1;
      if (timeout.count() >= 0) {
        left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left < 1) left = 1;
      }
      fetch(k, left);
    }
  }

 private:
  std::vector<char> fetch(const std::string& key, int64_t timeout_ms) {
    char err[1024] = {0};
    void* data = nullptr;
    size_t n = 0;
    int rc = ops_.get(h_, const_cast<char*>(key.data()), key.size(), timeout_ms, &data, &n, err, sizeof err);
    if (rc != CPG_OK) throw Fail{rc, err};
    std::vector<char> v(static_cast<char*>(data), static_cast<char*>(data) + n);
    std::free(data);
    return v;
  }

  cpg_store_ops ops_;
  uintptr_t h_;
};

}  // namespace cpgshim

using namespace cpgshim;

struct cpg_store {
  std::unique_ptr<CallbackStore> s;
};

struct cpg_device {
  std::shared_ptr<gloo::transport::Device> dev;
};

extern "C" {

void cpg_free(void* p) { std::free(p); }

int cpg_store_new(const cpg_store_ops* ops, uintptr_t h, cpg_store** out, char* err, size_t errlen) {
  return guard(err, errlen, [&] {
    if (ops == nullptr || ops->set == nullptr || ops->get == nullptr) throw Fail{CPG_INVALID, "nil store operations"};
    auto s = std::make_unique<cpg_store>();
    s->s = std::make_unique<CallbackStore>(*ops, h);
    *out = s.release();
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
    gloo::rendezvous::PrefixStore ps(prefix, *s->s);
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
