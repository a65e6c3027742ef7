// gloo_collectives.cc — the collectives of gloo_shim.h over a Gloo context.
//
// Small groups (up to cpg_ctx::directMax members: 32 unless CPCACHE_GLOO_DIRECT_MAX says)
// use a direct exchange over Gloo's unbound buffers: each member sends one kFrame-byte frame
// to every other member (a header naming the collective and its arguments, then up to
// kInline bytes of payload) and receives theirs.
// Every frame has the same size whatever the collective, so members that disagree exchange
// well-formed frames and detect the mismatch from the headers instead of corrupting data.
// Larger groups use Gloo's own algorithms (ring allreduce, allgatherv, broadcast, barrier).
#include <algorithm>
#include <functional>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/transport/unbound_buffer.h>

#include "gloo_shim_internal.h"

using namespace cpgshim;

namespace {

constexpr size_t kFrame = 512;
constexpr uint32_t kMagic = 0x63706367;  // "cpcg"
constexpr uint64_t kSlotPrefix = 0x40ULL << 56;

enum Kind : uint32_t { kAllreduce = 1, kBroadcast = 2, kAllgather = 3, kBarrier = 4 };

struct Header {
  uint32_t magic;
  uint32_t kind;
  int64_t arg;  // allreduce: op; broadcast: root
  int64_t len;  // allreduce: elements; broadcast, allgather: payload bytes
  uint64_t seq;
};
static_assert(sizeof(Header) == 32, "frame header is 32 bytes");
constexpr size_t kInline = kFrame - sizeof(Header);

const char* kindName(uint32_t k) {
  switch (k) {
    case kAllreduce: return "allreduce";
    case kBroadcast: return "broadcast";
    case kAllgather: return "allgather";
    case kBarrier: return "barrier";
  }
  return "unknown";
}

std::string describe(const Header& h) {
  std::string s = kindName(h.kind);
  if (h.kind == kAllreduce) s += " op " + std::to_string(h.arg) + " of " + std::to_string(h.len) + " elements";
  if (h.kind == kBroadcast) s += " from root " + std::to_string(h.arg);
  return s + " (op #" + std::to_string(h.seq) + ")";
}

// Op is one collective in flight: its memory and Gloo buffers, kept alive in the context's
// graveyard if it fails.
struct Op {
  cpg_ctx* c;
  int rank, size;
  Deadline deadline;
  std::vector<std::shared_ptr<void>> keep;

  Op(cpg_ctx* c, int64_t timeout_ms)
      : c(c), rank(c->ctx->rank), size(c->ctx->size), deadline(deadlineIn(timeout_ms)) {}

  std::shared_ptr<std::vector<char>> mem(size_t n) {
    auto m = std::make_shared<std::vector<char>>(n);
    keep.push_back(m);
    return m;
  }

  std::shared_ptr<gloo::transport::UnboundBuffer> buffer(std::vector<char>& m) {
    std::shared_ptr<gloo::transport::UnboundBuffer> b(c->ctx->createUnboundBuffer(m.data(), m.size()).release());
    keep.push_back(b);
    return b;
  }

  uint64_t nextSlot() { return kSlotPrefix | (c->seq++ & 0xffffffffffffULL); }

  // waitAll waits for nrecv receives and nsend sends of b to complete, within the deadline.
  void waitAll(gloo::transport::UnboundBuffer& b, int nrecv, int nsend) {
    for (int i = 0; i < nrecv; i++) {
      int src = -1;
      if (!b.waitRecv(&src, remaining(deadline))) throw Fail{CPG_ERROR, "receive aborted"};
    }
    for (int i = 0; i < nsend; i++) {
      int dst = -1;
      if (!b.waitSend(&dst, remaining(deadline))) throw Fail{CPG_ERROR, "send aborted"};
    }
  }

  // frames exchanges kFrame-byte frames: frames[r] is member r's. With root < 0 every member
  // sends its own to all others; else only root sends and the others receive root's.
  void exchange(std::vector<char>& frames, int root) {
    auto b = buffer(frames);
    uint64_t slot = nextSlot();
    int nsend = 0, nrecv = 0;
    for (int p = 0; p < size; p++) {
      if (p == rank) continue;
      if (root < 0 || root == rank) {
        b->send(p, slot, static_cast<size_t>(rank) * kFrame, kFrame);
        nsend++;
      }
      if (root < 0 || root == p) {
        b->recv(p, slot, static_cast<size_t>(p) * kFrame, kFrame);
        nrecv++;
      }
    }
    waitAll(*b, nrecv, nsend);
  }

  Header* frame(std::vector<char>& frames, int r) {
    return reinterpret_cast<Header*>(frames.data() + static_cast<size_t>(r) * kFrame);
  }

  // check compares member r's header with this member's (kind, arg and, for allreduce, len).
  void check(const Header& mine, const Header& theirs, int r) {
    bool same = theirs.magic == kMagic && theirs.kind == mine.kind && theirs.arg == mine.arg &&
                (mine.kind != kAllreduce || theirs.len == mine.len) && theirs.seq == mine.seq;
    if (!same) {
      throw Fail{CPG_MISMATCH, "rank " + std::to_string(rank) + " called " + describe(mine) + " but rank " +
                                   std::to_string(r) + " called " + describe(theirs)};
    }
  }

  Header header(uint32_t kind, int64_t arg, int64_t len) {
    return Header{kMagic, kind, arg, len, c->seq};
  }

  // finish records a failure: keeps the buffers and, on an I/O error, closes every connection
  // so that peers blocked on this member fail promptly instead of at their deadline.
  int finish(int code) {
    if (code == CPG_OK) return code;
    c->graveyard.insert(c->graveyard.end(), keep.begin(), keep.end());
    if (code == CPG_IO && !c->dead) {
      c->dead = true;
      try {
        c->ctx->closeConnections();
      } catch (...) {
      }
    }
    return code;
  }
};

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

ReduceFn reduceFn(int op) {
  switch (op) {
    case CPG_MIN: return [](void* a, const void* b, const void* d, size_t k) { gloo::min<int64_t>(a, b, d, k); };
    case CPG_MAX: return [](void* a, const void* b, const void* d, size_t k) { gloo::max<int64_t>(a, b, d, k); };
    case CPG_SUM: return [](void* a, const void* b, const void* d, size_t k) { gloo::sum<int64_t>(a, b, d, k); };
  }
  throw Fail{CPG_INVALID, "unknown reduce op " + std::to_string(op)};
}

// ringAllreduce reduces vals in place with Gloo's ring allreduce, through memory the op keeps.
void ringAllreduce(Op& o, const ReduceFn& fn, int64_t* vals, size_t n) {
  const size_t bytes = n * sizeof(int64_t);
  auto data = o.mem(bytes);
  std::memcpy(data->data(), vals, bytes);
  gloo::AllreduceOptions opts(o.c->ctx);
  opts.setOutput(reinterpret_cast<int64_t*>(data->data()), n);
  opts.setReduceFunction(fn);
  opts.setTimeout(remaining(o.deadline));
  gloo::allreduce(opts);
  std::memcpy(vals, data->data(), bytes);
}

void allreduce(Op& o, int op, int64_t* vals, size_t n) {
  ReduceFn fn = reduceFn(op);
  if (o.size > o.c->directMax) {
    // Gloo's ring detects no length mismatch; an empty vector skips it. Smaller groups
    // exchange even an empty vector's header, which catches a member of another length.
    if (n > 0) ringAllreduce(o, fn, vals, n);
    return;
  }
  const size_t bytes = n * sizeof(int64_t);
  auto frames = o.mem(kFrame * o.size);
  Header mine = o.header(kAllreduce, op, static_cast<int64_t>(n));
  *o.frame(*frames, o.rank) = mine;
  const bool inlined = bytes <= kInline;
  if (inlined && bytes > 0) std::memcpy(frames->data() + o.rank * kFrame + sizeof(Header), vals, bytes);
  o.exchange(*frames, -1);
  for (int p = 0; p < o.size; p++) o.check(mine, *o.frame(*frames, p), p);
  if (!inlined) {  // every member agreed on n: reduce the data with Gloo's ring
    ringAllreduce(o, fn, vals, n);
    return;
  }
  if (n == 0) return;
  std::vector<int64_t> acc(n);
  std::memcpy(acc.data(), frames->data() + sizeof(Header), bytes);
  for (int p = 1; p < o.size; p++) {
    fn(acc.data(), acc.data(), frames->data() + p * kFrame + sizeof(Header), n);
  }
  std::memcpy(vals, acc.data(), bytes);
}

std::vector<char> broadcast(Op& o, int root, const void* in, size_t n) {
  if (root < 0 || root >= o.size) throw Fail{CPG_INVALID, "root " + std::to_string(root) + " out of range"};
  const bool isRoot = o.rank == root;
  if (o.size > o.c->directMax) {
    auto lenbuf = o.mem(sizeof(int64_t));
    int64_t len = isRoot ? static_cast<int64_t>(n) : 0;
    std::memcpy(lenbuf->data(), &len, sizeof len);
    gloo::BroadcastOptions lo(o.c->ctx);
    lo.setRoot(root);
    if (isRoot) lo.setInput(reinterpret_cast<int64_t*>(lenbuf->data()), 1);
    lo.setOutput(reinterpret_cast<int64_t*>(lenbuf->data()), 1);
    lo.setTimeout(remaining(o.deadline));
    gloo::broadcast(lo);
    std::memcpy(&len, lenbuf->data(), sizeof len);
    auto data = o.mem(static_cast<size_t>(len));
    if (isRoot && len > 0) std::memcpy(data->data(), in, n);
    if (len > 0) {
      gloo::BroadcastOptions d(o.c->ctx);
      d.setRoot(root);
      if (isRoot) d.setInput(data->data(), static_cast<size_t>(len));
      d.setOutput(data->data(), static_cast<size_t>(len));
      d.setTimeout(remaining(o.deadline));
      gloo::broadcast(d);
    }
    return *data;
  }
  auto frames = o.mem(kFrame * o.size);
  Header mine = o.header(kBroadcast, root, isRoot ? static_cast<int64_t>(n) : 0);
  *o.frame(*frames, o.rank) = mine;
  if (isRoot && n > 0) std::memcpy(frames->data() + o.rank * kFrame + sizeof(Header), in, std::min(n, kInline));
  o.exchange(*frames, root);
  Header theirs = *o.frame(*frames, root);
  if (!isRoot) {
    mine.len = theirs.len;
    o.check(mine, theirs, root);
  }
  if (theirs.len < 0) throw Fail{CPG_ERROR, "negative broadcast length " + std::to_string(theirs.len)};
  const size_t len = static_cast<size_t>(theirs.len);
  std::vector<char> out(len);
  std::memcpy(out.data(), frames->data() + root * kFrame + sizeof(Header), std::min(len, kInline));
  if (len > kInline) {  // the rest, straight from the root
    auto rest = o.mem(len - kInline);
    if (isRoot) std::memcpy(rest->data(), static_cast<const char*>(in) + kInline, len - kInline);
    auto b = o.buffer(*rest);
    uint64_t slot = o.nextSlot();
    int nsend = 0, nrecv = 0;
    if (isRoot) {
      for (int p = 0; p < o.size; p++) {
        if (p != root) {
          b->send(p, slot, 0, rest->size());
          nsend++;
        }
      }
    } else {
      b->recv(root, slot, 0, rest->size());
      nrecv++;
    }
    o.waitAll(*b, nrecv, nsend);
    std::memcpy(out.data() + kInline, rest->data(), rest->size());
  }
  return out;
}

// allgather returns the concatenated data and each member's length.
std::vector<char> allgather(Op& o, const void* in, size_t n, std::vector<size_t>& lens) {
  const size_t size = static_cast<size_t>(o.size);
  lens.assign(size, 0);
  std::vector<int64_t> lens64(size);
  const bool direct = o.size <= o.c->directMax;
  std::shared_ptr<std::vector<char>> frames;  // direct exchange: every member's frame
  if (direct) {
    frames = o.mem(kFrame * size);
    Header mine = o.header(kAllgather, 0, static_cast<int64_t>(n));
    *o.frame(*frames, o.rank) = mine;
    if (n > 0) std::memcpy(frames->data() + o.rank * kFrame + sizeof(Header), in, std::min(n, kInline));
    o.exchange(*frames, -1);
    for (int p = 0; p < o.size; p++) {
      Header h = *o.frame(*frames, p);
      mine.len = h.len;
      o.check(mine, h, p);
      lens64[p] = h.len;
    }
  } else {  // Gloo's allgatherv of the lengths
    auto lenbuf = o.mem((size + 1) * sizeof(int64_t));
    int64_t mine = static_cast<int64_t>(n);
    std::memcpy(lenbuf->data() + size * sizeof(int64_t), &mine, sizeof mine);
    gloo::AllgathervOptions lo(o.c->ctx);
    lo.setInput(reinterpret_cast<int64_t*>(lenbuf->data()) + size, 1);
    lo.setOutput(reinterpret_cast<int64_t*>(lenbuf->data()), std::vector<size_t>(size, 1));
    lo.setTimeout(remaining(o.deadline));
    gloo::allgatherv(lo);
    std::memcpy(lens64.data(), lenbuf->data(), size * sizeof(int64_t));
  }
  bool big = false;
  size_t total = 0;
  for (size_t r = 0; r < size; r++) {
    if (lens64[r] < 0) throw Fail{CPG_ERROR, "negative allgather length from rank " + std::to_string(r)};
    lens[r] = static_cast<size_t>(lens64[r]);
    big = big || lens[r] > kInline;
    total += lens[r];
  }
  if (direct && !big) {  // every member's data came inline in its frame
    std::vector<char> out(total);
    size_t off = 0;
    for (size_t r = 0; r < size; r++) {
      std::memcpy(out.data() + off, frames->data() + r * kFrame + sizeof(Header), lens[r]);
      off += lens[r];
    }
    return out;
  }
  // The data with Gloo's allgatherv (every member knows every length).
  auto inbuf = o.mem(n);
  if (n > 0) std::memcpy(inbuf->data(), in, n);
  auto out = o.mem(total);
  if (total > 0) {
    gloo::AllgathervOptions d(o.c->ctx);
    d.setInput(inbuf->data(), n);
    d.setOutput(out->data(), lens);
    d.setTimeout(remaining(o.deadline));
    gloo::allgatherv(d);
  }
  return *out;
}

void barrier(Op& o) {
  if (o.size > o.c->directMax) {
    gloo::BarrierOptions b(o.c->ctx);
    b.setTimeout(remaining(o.deadline));
    gloo::barrier(b);
    return;
  }
  auto frames = o.mem(kFrame * o.size);
  Header mine = o.header(kBarrier, 0, 0);
  *o.frame(*frames, o.rank) = mine;
  o.exchange(*frames, -1);
  for (int p = 0; p < o.size; p++) o.check(mine, *o.frame(*frames, p), p);
}

// run guards one collective: refuses a dead context, skips communication in a group of one,
// and records a failure.
template <typename F>
int run(cpg_ctx* c, int64_t timeout_ms, char* err, size_t errlen, F&& body) {
  if (c == nullptr) {
    put(err, errlen, "nil context");
    return CPG_INVALID;
  }
  std::unique_ptr<Op> op;
  int code = guard(err, errlen, [&] {
    if (c->dead) throw Fail{CPG_IO, "context closed after an earlier I/O error"};
    op = std::make_unique<Op>(c, timeout_ms);
    body(*op);
    return CPG_OK;
  });
  return op ? op->finish(code) : code;
}

}  // namespace

extern "C" {

int cpg_allreduce_i64(cpg_ctx* c, int op, int64_t* vals, size_t n, int64_t timeout_ms, char* err,
                      size_t errlen) {
  return run(c, timeout_ms, err, errlen, [&](Op& o) {
    if (o.size == 1) {
      reduceFn(op);  // validates op
      return;
    }
    allreduce(o, op, vals, n);
  });
}

int cpg_broadcast(cpg_ctx* c, int root, const void* in, size_t n, int64_t timeout_ms, void** out,
                  size_t* outlen, char* err, size_t errlen) {
  return run(c, timeout_ms, err, errlen, [&](Op& o) {
    std::vector<char> data;
    if (o.size == 1) {
      if (root != 0) throw Fail{CPG_INVALID, "root " + std::to_string(root) + " out of range"};
      if (n > 0) data.assign(static_cast<const char*>(in), static_cast<const char*>(in) + n);
    } else {
      data = broadcast(o, root, in, n);
    }
    *out = dupBytes(data.data(), data.size());
    *outlen = data.size();
  });
}

int cpg_allgather(cpg_ctx* c, const void* in, size_t n, int64_t timeout_ms, void** out, size_t** lens,
                  char* err, size_t errlen) {
  return run(c, timeout_ms, err, errlen, [&](Op& o) {
    std::vector<size_t> ls;
    std::vector<char> data;
    if (o.size == 1) {
      ls.assign(1, n);
      if (n > 0) data.assign(static_cast<const char*>(in), static_cast<const char*>(in) + n);
    } else {
      data = allgather(o, in, n, ls);
    }
    auto* l = static_cast<size_t*>(std::malloc(ls.size() * sizeof(size_t)));
    if (l == nullptr) throw std::bad_alloc();
    std::memcpy(l, ls.data(), ls.size() * sizeof(size_t));
    try {
      *out = dupBytes(data.data(), data.size());
    } catch (...) {
      std::free(l);
      throw;
    }
    *lens = l;
  });
}

int cpg_barrier(cpg_ctx* c, int64_t timeout_ms, char* err, size_t errlen) {
  return run(c, timeout_ms, err, errlen, [&](Op& o) {
    if (o.size > 1) barrier(o);
  });
}

}  // extern "C"
