"""cpcache — Python binding of libcpcache (include/cpcache.h) over ctypes.

No compiled extension: the module loads libcpcache.so (the library built from
cmd/libcpcache) and mirrors the header's structs; the library checks each struct's size, so a
mirror that drifted from the header fails with SizeError instead of corrupting memory.

The library is found at $CPCACHE_LIBRARY, else next to this package, else in the
repository's build/ directory, else by the loader (ctypes.util.find_library("cpcache")).

Replicated calls ([R] in cpcache.h) must be made by every rank of the replica group in the
same order with the same arguments; local ones ([L]) are this rank's. Calls release the GIL.

Memory views: l1_page() returns a memoryview of an L1 page. The pool of a cache opened with
L1_ALLOC is allocated by this module (an anonymous private mapping, handed to the library as
an L1_HOST pool), so that its lifetime follows Python's references: close() releases every
view l1_page() returned (using one afterwards raises ValueError, as any released memoryview
does), then unmaps the pool. A buffer derived from a view — a slice of it, a numpy array or
ctypes object over it — cannot be released from here: it keeps the closed cache's pool mapped
(close() warns with a ResourceWarning), detached from any cache, so writing through it never
faults and never reaches a later cache's L1. With L1_HOST the memory is the caller's: close()
releases the views, and derived buffers are the caller's to retire before freeing it.

Signals: the Go runtime inside libcpcache installs no SIGINT handler in a foreign process,
so Python's stays in place. Python runs it only in the main thread, between bytecodes, so the
calls that wait for peers — step(), flush() and Cache() (its rendezvous) — made from the main
thread while a Python SIGINT handler is installed run on a helper thread (one per cache, kept)
while the main thread waits in short slices: Ctrl-C raises KeyboardInterrupt at once even
while a peer is late, and the cache is aborted (cpcache_abort: the collective returns, this
rank leaves and is closed; its peers see it lost, as when it closes). The hand-off costs tens
of microseconds a step; calls from other threads, or without a Python SIGINT handler, go to
the library directly. Close the cache in a finally block (or use `with`); peers then see this
rank as lost and fail promptly instead of at their deadline.

Errors: each CPCACHE_ERR_* status is a subclass of Error; TimeoutError_ (CacheTimeoutError)
is also the builtin TimeoutError and IOError_ (CacheIOError) an OSError. Cache()'s errors
name its arguments (store, kv_layout[i], kv_layers, cpcache.L1_HOST, None) where the library
names cpcache_config's fields; e.c_message keeps the library's words.

Fork: the Go runtime inside libcpcache does not survive fork(). In a process forked after the
library was loaded (os.fork(), or multiprocessing's "fork" start method, the default on Linux
before Python 3.14 and vLLM's), every call raises ForkedError at once, naming the parent's pid
(the library checks in C, before entering Go); version() still answers. A Cache inherited from
the parent cannot be used there: its close() and its finalizer return at once in the child and
touch nothing the parent owns, whose cache keeps working. Open the cache in a process started
with the "spawn" (or "forkserver") start method, or import and load the library after the fork.
"""

import array
import ctypes
import ctypes.util
import mmap
import _thread
import os
import re
import signal
import sys
from _signal import getsignal as _signal_getsignal  # signal.getsignal without its enum conversion
import threading
import time
import warnings
import weakref
from collections import namedtuple

__all__ = [
    "Cache", "Error", "InvalidError", "SizeError", "RangeError", "ClosedError", "AlreadyOpenError",
    "ConfigError", "NodeError", "L1FullError", "BusyError", "DivergedError", "PeerLostError",
    "TimeoutError_", "IOError_", "CacheTimeoutError", "CacheIOError", "NotStartedError", "ForkedError", "InternalError", "MatchResult", "InsertResult", "FillPage",
    "Evicted", "SlotsInserted", "SlotsLoaded", "SlotsEvicted", "LocsInserted", "LocsLoaded", "LocsEvicted", "RoomMade",
    "SLAB_HOST", "SLAB_CUDA_IPC", "L1_ALLOC", "L1_HOST", "L1_DEVICE",
    "WRITE_THROUGH", "WRITE_THROUGH_SELECTIVE", "WRITE_BACK", "library", "version", "ABI_VERSION",
    "KV_SHARDED", "KV_REPLICATED", "MEM_HOST", "MEM_DEVICE", "L1Buffer", "token_slot_buffer", "block_major_buffers",
    "StoreAdapter",
]

ABI_VERSION = 3  # CPCACHE_ABI_VERSION of the header this module mirrors

SLAB_HOST, SLAB_CUDA_IPC = 0, 1
L1_ALLOC, L1_HOST, L1_DEVICE = 0, 1, 2
WRITE_THROUGH, WRITE_THROUGH_SELECTIVE, WRITE_BACK = 0, 1, 2


class Error(Exception):
    """A failed libcpcache call: code is the CPCACHE_ERR_* status, the message the library's
    (str(e); an error of Cache() names the Python arguments: see _python_terms)."""

    code = None

    def __init__(self, code, message):
        # One argument: OSError's subclasses (TimeoutError_, IOError_) would read two as
        # (errno, strerror) and print "[Errno -12] ...".
        super().__init__(message)
        self.code = code


class InvalidError(Error): pass          # CPCACHE_ERR_INVALID
class SizeError(Error): pass             # CPCACHE_ERR_SIZE
class RangeError(Error): pass            # CPCACHE_ERR_RANGE
class ClosedError(Error): pass           # CPCACHE_ERR_CLOSED
class AlreadyOpenError(Error): pass      # CPCACHE_ERR_ALREADY_OPEN
class ConfigError(Error): pass           # CPCACHE_ERR_CONFIG
class NodeError(Error): pass             # CPCACHE_ERR_NODE
class L1FullError(Error): pass           # CPCACHE_ERR_L1_FULL
class BusyError(Error): pass             # CPCACHE_ERR_BUSY
class DivergedError(Error): pass         # CPCACHE_ERR_DIVERGED
class PeerLostError(Error): pass         # CPCACHE_ERR_PEER_LOST
class TimeoutError_(Error, TimeoutError):  # CPCACHE_ERR_TIMEOUT
    """A collective or a wait passed its deadline: also a builtin TimeoutError (an OSError),
    so `except TimeoutError` catches it. errno is None; code is the CPCACHE_ERR_* status."""


class IOError_(Error, OSError):           # CPCACHE_ERR_IO
    """A transfer (copy) failed on this rank: also a builtin OSError, so `except OSError`
    catches it. errno is None; code is the CPCACHE_ERR_* status."""


# The same classes under names without the trailing underscore.
CacheTimeoutError, CacheIOError = TimeoutError_, IOError_
class NotStartedError(Error): pass       # CPCACHE_ERR_NOT_STARTED
class InternalError(Error): pass         # CPCACHE_ERR_INTERNAL


class ForkedError(Error):
    """CPCACHE_ERR_FORKED: this process was forked (os.fork(), multiprocessing's fork start
    method) after libcpcache was loaded; the library cannot be used in it. The message names
    the parent's pid. Open the cache in a process started with the spawn start method, or
    load the library after the fork."""


_ERRORS = {-1: InvalidError, -2: SizeError, -3: RangeError, -4: ClosedError, -5: AlreadyOpenError,
           -6: ConfigError, -7: NodeError, -8: L1FullError, -9: BusyError, -10: DivergedError,
           -11: PeerLostError, -12: TimeoutError_, -13: IOError_, -14: NotStartedError,
           -15: ForkedError, -100: InternalError}

_i32, _i64, _u32, _u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64


KV_SHARDED, KV_REPLICATED = 1, 2  # CPCACHE_KV_*: how attention-TP ranks hold a part
MEM_HOST, MEM_DEVICE = 1, 2  # CPCACHE_MEM_*: where an L1 buffer lives
_L2_LAYOUTS = {None: 0, "page_first": 1, "layer_first": 2}
# CPCACHE_L1_*_OWNED: who picks L1 slots (cpcache_config.l1_mode).
_L1_MODES = {None: 0, "cache_owned": 0, "engine_owned": 1}


class _KVPart(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("bytes_per_token", _i64), ("sharding", _i32), ("reserved", _i32)]


class _L1Buffer(ctypes.Structure):
    _fields_ = [("layer", _i32), ("part", _i32), ("kind", _i32), ("token_bytes", _i32), ("base", ctypes.c_void_p),
                ("bytes", _i64), ("page_stride", _i64), ("token_stride", _i64)]


# cpcache_store's callbacks (include/cpcache.h).
_STORE_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
_STORE_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _i64, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t)
_STORE_ADD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _i64,
                              ctypes.POINTER(_i64), ctypes.c_void_p, ctypes.c_size_t)
_STORE_DEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.c_size_t)
_STORE_OK, _STORE_ABSENT, _STORE_ERROR = 0, 1, -1
_ABSENT = b"\0cpcache: absent\0"  # compare_set's sentinel: no value the library writes equals it


class _StoreCallbacks(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("set", _STORE_SET), ("get", _STORE_GET), ("add", _STORE_ADD),
                ("del", _STORE_DEL)]


class _Config(ctypes.Structure):
    _fields_ = [("struct_size", _u32), ("abi_version", _u32),
                ("world", _i32), ("tp", _i32), ("dp", _i32), ("attn_cp", _i32), ("ep", _i32),
                ("dp_attention", _i32), ("rank", _i32),
                ("store_url", ctypes.c_char_p), ("consensus", ctypes.c_char_p), ("timeout_ms", _i64),
                ("page_tokens", _i32), ("page_bytes", _i64),
                ("slab_backend", _i32), ("device", _i32), ("pin_host", _i32), ("l2_pages", _i64),
                ("l1_kind", _i32), ("l1_base", ctypes.c_void_p), ("l1_pages", _i64),
                ("policy", _i32), ("write_threshold", _i32), ("min_load_pages", _i32),
                ("load_quota_pages", _i32),
                ("storage_url", ctypes.c_char_p), ("model", ctypes.c_char_p),
                # ABI 2
                ("kv_layout", ctypes.c_char_p), ("kv_parts", ctypes.POINTER(_KVPart)), ("kv_num_parts", _i32),
                ("kv_num_layers", _i32), ("l1_buffers", ctypes.POINTER(_L1Buffer)), ("l1_num_buffers", _i32),
                ("l2_layout", _i32), ("l1_mode", _i32),
                # ABI 3
                ("store", ctypes.POINTER(_StoreCallbacks)), ("job_id", ctypes.c_char_p), ("local_world", _i32),
                ("kv_events_endpoint", ctypes.c_char_p), ("kv_events_replay_endpoint", ctypes.c_char_p),
                ("kv_events_topic", ctypes.c_char_p), ("metrics_addr", ctypes.c_char_p)]


L1Buffer = namedtuple("L1Buffer", "layer part kind base bytes page_stride token_stride owner token_bytes slots",
                      defaults=(None, None))
L1Buffer.__doc__ = """One (layer, part) buffer of the engine's L1 (cpcache_l1_buffer): token k of
page slot s at base + s*page_stride + k*token_stride. owner is the array or tensor whose
memory it is (kept alive by the Cache). token_bytes: the bytes of one token's row of the
array (its non-token dimensions × element size), which the open checks against the layout
part's bytes per token on this rank (None or 0: not checked, a padded row); slots: the page
slots the array holds (Cache takes l1_pages from the buffers' smallest when not given)."""


def _interface_memory(ai, kind):
    """_array_memory of an __array_interface__ or __cuda_array_interface__ dict (strides None:
    C-contiguous)."""
    if ai["data"][1]:
        raise ValueError("cpcache: an L1 buffer must be writable (the cache loads pages into it)")
    shape = [int(n) for n in ai["shape"]]
    itemsize = int(ai["typestr"][2:])
    strides = ai.get("strides")
    if strides is None:
        strides, step = [], itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    n = 1
    for d in shape:
        n *= d
    return int(ai["data"][0]), kind, [int(st) for st in strides], shape, n * itemsize


def _array_memory(a):
    """(base address, kind, byte strides, shape, nbytes) of a numpy array or a torch tensor
    (a CUDA tensor, .is_cuda, is device memory: MEM_DEVICE), or of an object with
    __cuda_array_interface__ (CuPy, Numba: device memory) or __array_interface__ (host)."""
    if hasattr(a, "data_ptr") and hasattr(a, "element_size"):  # torch.Tensor
        es = a.element_size()
        kind = MEM_DEVICE if getattr(a, "is_cuda", False) else MEM_HOST
        return a.data_ptr(), kind, [st * es for st in a.stride()], list(a.shape), a.numel() * es
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return _interface_memory(cai, MEM_DEVICE)
    ai = getattr(a, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"cpcache: an L1 buffer must be a numpy array, a torch tensor or an object with "
                        f"__cuda_array_interface__, not {type(a).__name__}")
    return _interface_memory(ai, MEM_HOST)


def _extent(strides, shape, itemsize_bytes):
    """Bytes from the first to one past the last element of a strided array."""
    return sum((n - 1) * st for n, st in zip(shape, strides) if n > 0) + itemsize_bytes


def _row_bytes(shape, nbytes, token_dims, padded):
    """The bytes of one token's row of an array of shape (its dimensions after the first
    token_dims, times the element size), as token_bytes: 0 when padded (declared wider than
    the part: not checked) or when the array is empty."""
    n = 1
    for d in shape:
        n *= d
    if padded or n == 0:
        return 0
    row = nbytes // n
    for d in shape[token_dims:]:
        row *= d
    return row


def token_slot_buffer(layer, part, array, page_tokens, padded=False):
    """SGLang's layout: array [slots * page_tokens, ...] of one layer and part, indexed by token
    slot (its other dimensions, heads and head_dim: one token's row; a token's bytes in it
    need not be the whole row's stride, so that K and V interleaved per token, disjoint
    columns of one [tokens, 2 * row] array, are two such buffers). The row (the other
    dimensions × element size) must be the part's bytes per token on this rank, else the
    open is refused naming both; padded=True declares a row wider than the part (the part
    takes its first bytes)."""
    base, kind, strides, shape, nbytes = _array_memory(array)
    if len(shape) < 1 or shape[0] % page_tokens:
        raise ValueError(f"cpcache: layer {layer} part {part}: first dimension {shape[:1]} is not a multiple of "
                         f"page_tokens {page_tokens}")
    row = nbytes // shape[0] if shape[0] else 0
    return L1Buffer(layer, part, kind, base, _extent(strides, shape, (strides[-1] if len(shape) > 1 else row) or row),
                    page_tokens * strides[0], strides[0], array, _row_bytes(shape, nbytes, 1, padded),
                    shape[0] // page_tokens)


def block_major_buffers(layer, array, k_part=0, v_part=1, padded=False):
    """vLLM's layout: array [blocks, 2, page_tokens, ...] of one layer; its K (index 0 of the
    second dimension, part k_part) and V (index 1, part v_part) buffers. A token's row (the
    dimensions after page_tokens × element size) must be each part's bytes per token on this
    rank, unless padded=True declares it wider."""
    base, kind, strides, shape, nbytes = _array_memory(array)
    if len(shape) < 3 or shape[1] != 2:
        raise ValueError(f"cpcache: layer {layer}: a block-major tensor is [blocks, 2, page_tokens, ...], got shape {shape}")
    whole = _extent(strides, shape, strides[-1] if len(shape) > 3 else strides[2])
    row = _row_bytes(shape, nbytes, 3, padded)
    return [L1Buffer(layer, part, kind, base + kv * strides[1], whole - kv * strides[1], strides[0], strides[2], array,
                     row, shape[0])
            for kv, part in ((0, k_part), (1, v_part))]


class _Info(ctypes.Structure):
    _fields_ = [("struct_size", _u32), ("rank", _i32), ("world", _i32), ("cp_rank", _i32),
                ("cp_size", _i32), ("tp_rank", _i32), ("dp_rank", _i32), ("replica_size", _i32),
                ("page_tokens", _i32), ("page_bytes", _i64), ("l1_pages", _i64), ("l2_pages", _i64),
                ("l1_base", ctypes.c_void_p), ("consensus", ctypes.c_char_p)]


class _MatchResult(ctypes.Structure):
    _fields_ = [("node", _u64), ("device_pages", _i64), ("host_pages", _i64)]


class _FillPage(ctypes.Structure):
    _fields_ = [("slot", _i32), ("owner", _i32), ("index", _i64), ("hash", _u64), ("owned", _i32),
                ("_pad", _i32)]


class _InsertResult(ctypes.Structure):
    _fields_ = [("node", _u64), ("pages", _i64), ("n_fill", _i64), ("backups", _i64)]


_STATS_FIELDS = ["matches", "inserts", "l1_hit_pages", "l2_hit_pages", "inserted_pages",
                 "written_pages", "loaded_pages", "evicted_l1_pages", "evicted_l2_pages", "steps",
                 "digest_checks", "digest_mismatches", "collectives", "pages_written_l2",
                 "pages_loaded_l2", "transfer_errors", "l1_used", "l2_free_pages", "nodes", "pending",
                 "l2_enabled", "consensus_latency_median_ns", "consensus_latency_p99_ns",
                 "storage_hit_pages", "storage_prefetched_pages", "storage_backed_up_pages",
                 "storage_errors", "no_step_warnings"]


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", _u32)] + [(f, _i64) for f in _STATS_FIELDS]


MatchResult = namedtuple("MatchResult", "node device_pages host_pages l1_slots device_indices device_tokens host_tokens",
                         defaults=(None, 0, 0))
MatchResult.__doc__ = """What match found: node (the deepest matched node's handle), device_pages and
host_pages (the L1 hit, and the pages beyond it held in L2 only), l1_slots (this rank's slot of
each device page, -1 for another CP rank's: a list of ints), and the same in tokens: device_indices, an int64
array (numpy; a torch tensor when asked for) of this rank's L1 location of each device-hit
token (slot * page_tokens + k; -1 for another CP rank's token), device_tokens
(device_pages * page_tokens) and host_tokens (SGLang's host_hit_length)."""
InsertResult = namedtuple("InsertResult", "node pages fill backups")
FillPage = namedtuple("FillPage", "slot owner index hash owned")
Evicted = namedtuple("Evicted", "freed pending")
SlotsInserted = namedtuple("SlotsInserted", "node pages backups freed")
SlotsInserted.__doc__ = """What insert_slots did: the node and pages as InsertResult's, and freed: this
rank's slots the cache let go (the caller's slots it did not adopt, and those the insert's
evictions freed), for the engine's allocator."""
SlotsLoaded = namedtuple("SlotsLoaded", "pages freed")
SlotsLoaded.__doc__ = """What load_back_slots started: pages loading (the group's), and freed: the
caller's slots of pages that did not load and those the load's evictions freed."""
SlotsEvicted = namedtuple("SlotsEvicted", "freed pending slots")
SlotsEvicted.__doc__ = """evict_l1_slots: Evicted's freed and pending pages, and slots: this rank's
slots freed now (write-back evictions free theirs at a later step: take_freed_l1)."""
LocsInserted = namedtuple("LocsInserted", "node pages backups freed kept_tokens", defaults=(0,))
LocsInserted.__doc__ = """What insert_locs did: the node, pages and backups as InsertResult's, and
freed: this rank's locations the cache let go (an int64 array: the request's locations of
pages it did not adopt, and those the insert's evictions freed), for the engine's allocator;
kept_tokens: how many locations insert_locs(kept=...) wrote (0 without kept)."""
LocsLoaded = namedtuple("LocsLoaded", "pages tokens freed")
LocsLoaded.__doc__ = """What load_back_locs started: pages and tokens loading (the group's), and
freed: the caller's locations of pages that did not load and those the load's evictions freed."""
LocsEvicted = namedtuple("LocsEvicted", "freed_tokens pending_tokens freed")
LocsEvicted.__doc__ = """evict_locs: the group's tokens freed now and pending (write-back), and
freed: this rank's locations freed now, an int64 array."""
RoomMade = namedtuple("RoomMade", "room freed")
RoomMade.__doc__ = """make_room: room (True when every CP rank has room for its pages; False
when nothing more could be evicted) and freed, this rank's freed locations (int64 array)."""
Info = namedtuple("Info", [f for f, _ in _Info._fields_ if f != "struct_size"])


def _find_library():
    env = os.environ.get("CPCACHE_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "libcpcache.so"),
                 os.path.join(here, "..", "..", "build", "libcpcache.so")):
        if os.path.exists(cand):
            return cand
    found = ctypes.util.find_library("cpcache")
    if found:
        return found
    raise OSError("cpcache: libcpcache.so not found: set CPCACHE_LIBRARY, or build it (make capi)")


_lib = None


def version():
    """The library's version ("0.1.0"; cpcache_version() without its "cpcache " prefix): the
    repository's VERSION file, as the binary, CMake's package and the wheel carry it. It
    answers in a forked child too, at once (the library keeps the string in C storage)."""
    return library().cpcache_version().decode().removeprefix("cpcache ")


def library():
    """Loads libcpcache.so once and declares its functions."""
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(_find_library())
    P = ctypes.POINTER
    sigs = {
        "cpcache_version": ([], ctypes.c_char_p),
        "cpcache_abi_version": ([], ctypes.c_int),
        "cpcache_last_error": ([], ctypes.c_char_p),
        "cpcache_config_init": ([P(_Config)], ctypes.c_int),
        "cpcache_open": ([P(_Config), P(_u64)], ctypes.c_int),
        "cpcache_close": ([_u64], ctypes.c_int),
        "cpcache_abort": ([_u64], ctypes.c_int),
        "cpcache_get_info": ([_u64, P(_Info)], ctypes.c_int),
        "cpcache_kv_bytes_per_token": ([_u64, P(_i64)], ctypes.c_int),
        "cpcache_kv_page_bytes": ([_u64, P(_i64)], ctypes.c_int),
        "cpcache_match": ([_u64, P(_i32), ctypes.c_size_t, P(_MatchResult), P(_i32), ctypes.c_size_t], ctypes.c_int),
        "cpcache_match_key": ([_u64, ctypes.c_char_p, ctypes.c_size_t, P(_i32), ctypes.c_size_t, P(_MatchResult),
                               P(_i32), ctypes.c_size_t], ctypes.c_int),
        "cpcache_lock": ([_u64, _u64], ctypes.c_int),
        "cpcache_unlock": ([_u64, _u64], ctypes.c_int),
        "cpcache_load_back": ([_u64, _u64, P(_i64)], ctypes.c_int),
        "cpcache_load_pending": ([_u64, _u64, P(_i32)], ctypes.c_int),
        "cpcache_wait_l1": ([_u64, _u64, _i64], ctypes.c_int),
        "cpcache_wait_l1_layer": ([_u64, _u64, _i32, _i64], ctypes.c_int),
        "cpcache_wait_l1_layer_on": ([_u64, _u64, _i32, ctypes.c_void_p], ctypes.c_int),
        "cpcache_insert": ([_u64, P(_i32), ctypes.c_size_t, P(_InsertResult), P(_FillPage), ctypes.c_size_t], ctypes.c_int),
        "cpcache_insert_key": ([_u64, ctypes.c_char_p, ctypes.c_size_t, P(_i32), ctypes.c_size_t, P(_InsertResult),
                                P(_FillPage), ctypes.c_size_t], ctypes.c_int),
        "cpcache_evict_l1": ([_u64, _i64, P(_i64)], ctypes.c_int),
        "cpcache_evict_l1_ex": ([_u64, _i64, P(_i64), P(_i64)], ctypes.c_int),
        "cpcache_evict_l2": ([_u64, _i64, P(_i64)], ctypes.c_int),
        "cpcache_step": ([_u64], ctypes.c_int),
        "cpcache_pending": ([_u64, P(_i64)], ctypes.c_int),
        "cpcache_flush": ([_u64], ctypes.c_int),
        "cpcache_prefetch": ([_u64, P(_i32), ctypes.c_size_t, P(_u64)], ctypes.c_int),
        "cpcache_prefetch_key": ([_u64, ctypes.c_char_p, ctypes.c_size_t, P(_i32), ctypes.c_size_t, P(_u64)], ctypes.c_int),
        "cpcache_prefetch_pending": ([_u64, _u64, P(_i32)], ctypes.c_int),
        "cpcache_prefetch_revoke": ([_u64, _u64], ctypes.c_int),
        "cpcache_l1_page": ([_u64, _i32, P(ctypes.c_void_p), P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_get_stats": ([_u64, P(_Stats)], ctypes.c_int),
        "cpcache_metrics_text": ([_u64, ctypes.c_char_p, ctypes.c_size_t, P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_insert_slots": ([_u64, ctypes.c_char_p, ctypes.c_size_t, P(_i32), ctypes.c_size_t, P(_i32),
                                  ctypes.c_size_t, P(_InsertResult), P(_i32), ctypes.c_size_t, P(ctypes.c_size_t)],
                                 ctypes.c_int),
        "cpcache_load_back_plan": ([_u64, _u64, P(_i64), ctypes.c_size_t, P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_load_back_slots": ([_u64, _u64, P(_i32), ctypes.c_size_t, P(_i64), P(_i32), ctypes.c_size_t,
                                     P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_evict_l1_slots": ([_u64, _i64, P(_i64), P(_i64), P(_i32), ctypes.c_size_t, P(ctypes.c_size_t)],
                                   ctypes.c_int),
        "cpcache_take_freed_l1": ([_u64, P(_i32), ctypes.c_size_t, P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_l1_used_by": ([_u64, _i32, P(_i64)], ctypes.c_int),
        # The token-location calls take their arrays as addresses (c_void_p): numpy's and
        # torch's data pointers pass without a conversion per element.
        "cpcache_match_locs": ([_u64, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                P(_MatchResult), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                ctypes.c_size_t], ctypes.c_int),
        "cpcache_insert_locs": ([_u64, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p, ctypes.c_size_t, P(_InsertResult), ctypes.c_void_p,
                                 ctypes.c_size_t, P(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t,
                                 P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_load_back_locs": ([_u64, _u64, ctypes.c_void_p, ctypes.c_size_t, P(_i64), ctypes.c_void_p,
                                    ctypes.c_size_t, P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_evict_locs": ([_u64, _i64, P(_i64), P(_i64), ctypes.c_void_p, ctypes.c_size_t,
                                P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_take_freed_locs": ([_u64, ctypes.c_void_p, ctypes.c_size_t, P(ctypes.c_size_t)], ctypes.c_int),
        "cpcache_make_room": ([_u64, _i64, _i64, ctypes.c_void_p, P(_i32), ctypes.c_void_p, ctypes.c_size_t,
                               P(ctypes.c_size_t)], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    if lib.cpcache_abi_version() != ABI_VERSION:
        raise OSError(f"cpcache: {_find_library()} has ABI version {lib.cpcache_abi_version()}, "
                      f"this module mirrors {ABI_VERSION}")
    _lib = lib
    return lib


def _check(status, msg=None):
    if status != 0:
        if msg is None:
            msg = library().cpcache_last_error()
        msg = (msg or b"").decode(errors="replace")
        raise _ERRORS.get(status, Error)(status, msg)


# The C names in cpcache_open's messages and the Python arguments of Cache() they stand for.
_PY_TERMS = [
    (re.compile(r"\bcpcache_open\b"), "cpcache.Cache()"),
    (re.compile(r"\bcpcache_config\b"), "Cache()'s arguments"),
    (re.compile(r"\bstore_url\b"), "store"),
    (re.compile(r"\bkv_events_endpoint\b"), "kv_events"),
    (re.compile(r"\bkv_events_replay_endpoint\b"), "kv_events_replay"),
    (re.compile(r"\bkv_parts\b"), "kv_layout"),
    (re.compile(r"\bkv_num_layers\b"), "kv_layers"),
    (re.compile(r"\bkv_num_parts\b"), "len(kv_layout)"),
    (re.compile(r"\bl1_num_buffers\b"), "len(l1_buffers)"),
    (re.compile(r"\bpin_host = 1\b"), "pin_host=True"),
    (re.compile(r"\bCPCACHE_L2_(PAGE_FIRST|LAYER_FIRST)\b"), lambda m: repr(m.group(1).lower())),
    (re.compile(r"\bCPCACHE_L1_(CACHE_OWNED|ENGINE_OWNED)\b"), lambda m: repr(m.group(1).lower())),
    (re.compile(r"\bCPCACHE_POLICY_(\w+)"), r"cpcache.\1"),
    (re.compile(r"\bCPCACHE_(L1_ALLOC|L1_HOST|L1_DEVICE|MEM_HOST|MEM_DEVICE|KV_SHARDED|KV_REPLICATED|SLAB_HOST|"
                r"SLAB_CUDA_IPC)\b"), r"cpcache.\1"),
    (re.compile(r"\bNULL\b"), "None"),
]


def _python_terms(msg):
    """msg of a cpcache_open error with the C fields named as Cache()'s arguments."""
    for c_name, py_name in _C_ARGS:
        msg = msg.replace(c_name, py_name)
    for pattern, repl in _PY_TERMS:
        msg = pattern.sub(repl, msg)
    return msg


_MAIN_THREAD = threading.main_thread().ident
_SIGINT = int(signal.SIGINT)
_forked = False  # forked after the library was loaded: no helper thread of a cache in it


def _mark_forked():
    global _forked
    _forked = _forked or _lib is not None  # loaded after the fork: the child's own caches


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def _interruptible():
    """Whether a blocking call made now should run on a helper thread so that Ctrl-C
    interrupts it: called from the main thread (the only one Python runs signal handlers in)
    with a Python SIGINT handler installed, in the process that loaded the module (a forked
    child has no helper thread; its calls fail at once with ForkedError). Other callers call
    the library directly and pay well under a microsecond for this check."""
    if _forked or threading.get_ident() != _MAIN_THREAD:
        return False
    return callable(_signal_getsignal(_SIGINT))


class _Runner:
    """A helper thread that makes a cache's blocking calls (step, flush) for the main
    thread, which waits for each in slices that a signal interrupts (see _call_interruptibly).
    One per cache, kept between calls: the library's runtime binds its state to a thread the
    first time that thread calls in, which a thread per call would pay for every time."""

    def __init__(self):
        self._go, self._done = _thread.allocate_lock(), _thread.allocate_lock()
        self._go.acquire()
        self._done.acquire()
        self._job = self._result = None
        self.busy = False  # a call was handed over and has not been collected
        _thread.start_new_thread(self._loop, ())

    def _loop(self):
        while True:
            self._go.acquire()
            fn, args = self._job
            if fn is None:
                return
            try:
                st = fn(*args)
                self._result = (st, _lib.cpcache_last_error() if st else None)
            except BaseException as e:  # a ctypes argument error: the caller raises it
                self._result = e
            self._done.release()

    def call(self, fn, args, on_interrupt):
        """fn(*args) on the helper thread: (status, message), as _call_interruptibly."""
        self._job, self.busy = (fn, args), True
        self._go.release()
        try:
            _wait(self._done)
        except BaseException:
            on_interrupt(self._done)
            raise
        self.busy = False
        res, self._result = self._result, None
        if isinstance(res, BaseException):
            raise res
        return res

    def stop(self):
        """Ends the thread once it is done with the call it has (idempotent)."""
        if self._job != (None, None):
            self._job = (None, None)
            try:
                self._go.release()
            except RuntimeError:  # stopped by another thread at the same time
                pass


def _wait(done):
    """Waits until lock done is released, in short slices: a signal delivered to another
    thread (the library's) interrupts no wait of this one, and Python runs its handler, raising
    KeyboardInterrupt, at the end of the slice."""
    while not done.acquire(timeout=0.02):
        pass


def _call_interruptibly(fn, args, on_interrupt):
    """fn(*args) — a library call that may wait for peers — on a helper thread, while this
    (the main) thread waits for it in slices that a signal interrupts: returns (status,
    message of a failure, read on the helper thread, where the library recorded it). On
    KeyboardInterrupt (or any exception raised by a signal handler) calls
    on_interrupt(thread_done), which must make the call return (cpcache_abort), and re-raises."""
    done = _thread.allocate_lock()
    done.acquire()
    out = []

    def run():
        try:
            st = fn(*args)
            out.append((st, _lib.cpcache_last_error() if st else None))
        finally:
            done.release()

    _thread.start_new_thread(run, ())
    try:
        _wait(done)
    except BaseException:
        on_interrupt(done)
        raise
    return out[0]


def _invalid(msg):
    """The InvalidError of a value the binding refuses before calling the library."""
    return InvalidError(-1, "cpcache: " + msg)


def _arg(name, value, ctype):
    """value as an argument of ctype, refused (InvalidError naming it) when ctype would
    silently wrap it around: ctypes keeps only the low bits of an int out of range."""
    if ctype(value).value != value:
        raise _invalid(f"{name} {value!r} is out of range for {ctype.__name__}")
    return value


# Formats of a buffer whose items are native int32 (array('i'), numpy int32, memoryview 'i').
_INT32_FORMATS = ("i", "@i", "=i", "<i" if sys.byteorder == "little" else ">i")


def _key(key):
    """An isolation key as bytes: None is the empty key, a str is encoded as UTF-8."""
    if key is None:
        return b""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"cpcache: key must be bytes or str, not {type(key).__name__}")


def _tokens(tokens, what="token"):
    """A ctypes int32 array over tokens: a view of a writable buffer of native int32 items
    (array('i'), numpy int32), else a copy of the values, each checked to be an int32 (an
    error names the bad entry as `what` i). A buffer of other items (int64, float) is never
    reinterpreted as int32."""
    try:
        view = memoryview(tokens)
    except TypeError:
        view = None
    if view is not None:
        with view:
            if (view.ndim == 1 and view.itemsize == 4 and view.format in _INT32_FORMATS
                    and view.c_contiguous and not view.readonly):
                return (_i32 * len(view)).from_buffer(tokens), len(view)
            values = view.tolist()
    else:
        values = list(tokens)
    # array('i') converts and checks in C (a float, or an int out of range, raises), and
    # takes what ctypes took: ints and objects with __index__ (numpy integers).
    try:
        arr = array.array("i", values)
    except (TypeError, OverflowError):
        for i, t in enumerate(values):
            try:
                array.array("i", (t,))
            except (TypeError, OverflowError):
                raise _invalid(f"{what} {i} ({t!r}) is not an int32") from None
        raise
    return (_i32 * len(arr)).from_buffer(arr), len(arr)


def _bytes(s):
    return s.encode() if isinstance(s, str) else s


# Every store adapter made, for the life of the library: a store call the library abandoned
# at its deadline may still return (into the adapter's callbacks) after the cache closed.
_STORE_ADAPTERS = []


class StoreAdapter:
    """A rendezvous store object as the library's store callbacks (cpcache_store): any
    torch.distributed.Store (TCPStore, FileStore, PrefixStore, HashStore) or any object with
    set(key, value), get(key), add(key, delta) and delete_key(key), and check(keys) and
    wait(keys, timedelta) when it has them. The library writes only keys under "cpcache/";
    the store's other keys are never touched.

    A get that may wait polls (a torch store's own wait may leave its TCPStore client out of
    step once it times out): check([key]) then get when the store has check;
    compare_set(key, sentinel, sentinel) when it has compare_set (torch < 2.1; it creates
    nothing); else get, which must return None or raise KeyError for an absent key. One call
    at a time reaches the store (a lock): it need not be thread-safe. The callbacks run on the library's threads
    (they take the GIL); an exception in one is the library's error, with its message."""

    def __init__(self, store):
        self.store = store
        # Whether it has them (not the bound methods: they would keep the store after detach).
        self._check = callable(getattr(store, "check", None))
        self._compare_set = callable(getattr(store, "compare_set", None))
        self._lock = threading.Lock()  # one call at a time: a store object need not be thread-safe
        self.callbacks = _StoreCallbacks(None, _STORE_SET(self._set), _STORE_GET(self._get),
                                         _STORE_ADD(self._add), _STORE_DEL(self._del))

    @staticmethod
    def _fail(err, err_len, exc):
        msg = (f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))[:max(err_len - 1, 0)]
        if err and err_len:
            ctypes.memmove(err, msg + b"\0", len(msg) + 1)
        return _STORE_ERROR

    def _set(self, _ctx, key, key_len, value, value_len, err, err_len):
        try:
            k, v = ctypes.string_at(key, key_len).decode(), ctypes.string_at(value, value_len)
            with self._lock:
                self._store().set(k, v)
            return _STORE_OK
        except BaseException as e:  # never into C: a callback's exception is the call's error
            return self._fail(err, err_len, e)

    def detach(self):
        """Lets the store go: a call the library abandoned that still comes in fails, naming
        this, instead of keeping the store (a TCPStore client's socket) alive. The callbacks
        themselves stay (the library may still call them)."""
        self.store = None

    def _store(self):
        st = self.store
        if st is None:
            raise RuntimeError("the cache this store was given to is closed")
        return st

    def _probe(self, k):
        """k's value, or None when absent, without waiting."""
        store = self._store()
        if self._check:
            return store.get(k) if store.check([k]) else None
        if self._compare_set:
            # torch < 2.1 has no check, and its TCPStore client is out of step with the server
            # after a wait that timed out: compare_set with a sentinel no value equals reads the
            # value, or answers the sentinel (and creates nothing) when the key is absent.
            v = store.compare_set(k, _ABSENT, _ABSENT)
            return None if v == _ABSENT else v
        try:
            return store.get(k)
        except KeyError:
            return None

    def _lookup(self, k, timeout_ms):
        """k's value, or None when still absent after timeout_ms (polled: a store's own wait
        may not survive its timeout)."""
        deadline = time.monotonic() + timeout_ms / 1000
        pause = 0.001
        while True:
            with self._lock:
                v = self._probe(k)
            if v is not None or time.monotonic() >= deadline:
                return v
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(2 * pause, 0.01)

    def _get(self, _ctx, key, key_len, timeout_ms, buf, cap, length, err, err_len):
        try:
            v = self._lookup(ctypes.string_at(key, key_len).decode(), timeout_ms)
            if v is None:
                return _STORE_ABSENT
            if isinstance(v, str):
                v = v.encode()
            v = bytes(v)
            length[0] = len(v)
            if len(v) <= cap:
                ctypes.memmove(buf, v, len(v))
            return _STORE_OK
        except BaseException as e:
            return self._fail(err, err_len, e)

    def _add(self, _ctx, key, key_len, delta, value, err, err_len):
        try:
            k = ctypes.string_at(key, key_len).decode()
            with self._lock:
                value[0] = int(self._store().add(k, delta))
            return _STORE_OK
        except BaseException as e:
            return self._fail(err, err_len, e)

    def _del(self, _ctx, key, key_len, err, err_len):
        try:
            k = ctypes.string_at(key, key_len).decode()
            with self._lock:
                self._store().delete_key(k)
            return _STORE_OK
        except BaseException as e:
            return self._fail(err, err_len, e)


_STORE_METHODS = ("set", "get", "add", "delete_key")


def _store_arg(store, timeout_ms):
    """store= as (store_url bytes, StoreAdapter or None): a URL string (file://, redis://; a
    tcp://host:port of a torch TCPStore, as an engine's dist_init_method, is connected to as a
    client), or a store object (see StoreAdapter)."""
    if store is None or isinstance(store, (str, bytes)):
        url = store.decode() if isinstance(store, bytes) else store
        if url is not None and url.startswith("tcp://"):
            host, _, port = url[len("tcp://"):].rstrip("/").rpartition(":")
            try:
                from torch.distributed import TCPStore
            except ImportError:
                raise _invalid(f"store {url!r}: a tcp:// store is a torch TCPStore, and torch is not importable here: "
                               "pass a file:// or redis:// URL, or a store object") from None
            import datetime
            if not host or not port.isdigit():
                raise _invalid(f"store {url!r}: want tcp://host:port")
            client = TCPStore(host.strip("[]"), int(port), is_master=False,
                              timeout=datetime.timedelta(milliseconds=max(timeout_ms, 1)))
            return None, StoreAdapter(client)
        return _bytes(store), None
    if isinstance(store, StoreAdapter):
        return None, store
    missing = [m for m in _STORE_METHODS if not callable(getattr(store, m, None))]
    if missing:
        raise TypeError(f"cpcache: store= takes a URL (file:///dir, redis://host:port, tcp://host:port of a torch "
                        f"TCPStore) or a store object with set, get, add and delete_key "
                        f"(torch.distributed.TCPStore, FileStore, PrefixStore); {type(store).__module__}."
                        f"{type(store).__qualname__} has no {', '.join(missing)} (a process group is not a store: "
                        f"pass the store it was made with)")
    return None, StoreAdapter(store)


# The C ABI's names of open's arguments, as this binding's keywords (messages of open).
_C_ARGS = (("cpcache_config.store_url (a URL), cpcache_config.store (callbacks) or CPCACHE_STORE",
            "store= (a URL or a torch.distributed.Store) or CPCACHE_STORE"),
           ("cpcache_config.store_url", "store="), ("cpcache_config.store", "store="),
           ("cpcache_config.job_id", "job_id="))


# --- arrays of the token API: numpy (imported on first use), torch when asked for ---
_np = None


def _numpy():
    """numpy, or None where it is not installed (results are then array('q'))."""
    global _np
    if _np is None:
        try:
            import numpy
        except ImportError:
            _np = False
        else:
            _np = numpy
    return _np or None


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _want_torch(out, like=None):
    """Whether results are torch tensors: out "torch", or out None and like is a tensor."""
    if out is None:
        return like is not None and _is_torch(like)
    if out in ("torch", "numpy"):
        return out == "torch"
    raise _invalid(f"out {out!r} (want None, 'numpy' or 'torch')")


def _host(t):
    """A torch tensor's CPU numpy view (a copy from the device)."""
    if getattr(t, "is_cuda", False):
        t = t.cpu()
    return t.numpy()


def _int_ptr(values, what, itemsize):
    """(address, count, keep) of values as a C-contiguous array of native ints of itemsize
    bytes (4: int32 tokens, 8: int64 locations): a numpy array or torch tensor of that dtype
    passes by address, another integer dtype is converted (its values checked to fit), a
    list through array('i'/'q'). keep holds the memory alive for the call."""
    np = _np or _numpy()
    if np is not None and type(values) is np.ndarray and values.dtype.itemsize == itemsize and \
            values.dtype.kind == "i" and values.ndim == 1 and values.flags.c_contiguous:
        return values.ctypes.data, values.shape[0], values  # the engine's own array, in place
    if _is_torch(values):
        values = _host(values)
    if np is not None and isinstance(values, np.ndarray):
        want = np.int32 if itemsize == 4 else np.int64
        if values.ndim != 1:
            raise _invalid(f"{what}s must be one-dimensional, got shape {values.shape}")
        if values.dtype != want or not values.flags.c_contiguous:
            if values.dtype.kind not in "iu":
                raise _invalid(f"{what}s must be integers, got dtype {values.dtype}")
            if values.size and itemsize == 4 and values.dtype.itemsize > 4:
                lo, hi = int(values.min()), int(values.max())
                if lo < -2**31 or hi >= 2**31:
                    bad = int(np.nonzero((values < -2**31) | (values >= 2**31))[0][0])
                    raise _invalid(f"{what} {bad} ({int(values[bad])}) is not an int32")
            values = np.ascontiguousarray(values, dtype=want)
        return values.ctypes.data, values.shape[0], values
    if itemsize == 4:
        arr, n = _tokens(values, what)
        return arr, n, arr
    try:
        arr = array.array("q", values if isinstance(values, (list, tuple)) else list(values))
    except (TypeError, OverflowError):
        for i, t in enumerate(values):
            try:
                array.array("q", (t,))
            except (TypeError, OverflowError):
                raise _invalid(f"{what} {i} ({t!r}) is not an int64") from None
        raise
    return (arr.buffer_info()[0] if len(arr) else None), len(arr), arr


def _out_ptr(a, what):
    """(address, capacity) of a caller's int64 array the library writes into: a writable
    C-contiguous one-dimensional numpy int64 array or CPU torch int64 tensor, else
    InvalidError (a converted copy would take the writes)."""
    np = _numpy()
    if _is_torch(a):
        if getattr(a, "is_cuda", False) or str(a.dtype) != "torch.int64" or a.dim() != 1 or not a.is_contiguous():
            raise _invalid(f"{what} must be a contiguous one-dimensional CPU int64 tensor, got {a.dtype} {tuple(a.shape)}")
        return a.data_ptr(), a.shape[0]
    if np is None or not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim != 1 or \
            not a.flags.c_contiguous or not a.flags.writeable:
        raise _invalid(f"{what} must be a writable C-contiguous one-dimensional int64 numpy array")
    return a.ctypes.data, a.shape[0]


def _locs_copy(buf, count, torch):
    """_locs_out of a copy of the first count int64 of buf (a scratch buffer the next call
    overwrites)."""
    np = _numpy()
    if np is None:
        return _locs_out(buf, count, False)
    a = np.frombuffer(buf, np.int64, count).copy()
    if torch:
        import torch as _torch
        return _torch.from_numpy(a)
    return a


def _locs_out(buf, count, torch):
    """The first count int64 of ctypes buffer buf as an array sharing its memory: numpy (a
    torch tensor when torch), else array('q')."""
    np = _numpy()
    if np is None:
        out = array.array("q")
        out.frombytes(memoryview(buf).cast("B")[:count * 8])
        return out
    a = np.frombuffer(buf, np.int64, count)
    if torch:
        import torch as _torch
        return _torch.from_numpy(a)
    return a


def _alloc_pool(l1_pages, page_bytes):
    """The L1 pool of an L1_ALLOC cache, as an anonymous private mapping, and its address; None
    when the sizes are not ones the library would accept (it then rejects them, naming them),
    or when the mapping cannot be made: the library's own L1_ALLOC then checks the pool against
    the host's memory with every rank, so that all of them fail with this rank's cause instead
    of the others waiting for it until their deadline."""
    if not (isinstance(l1_pages, int) and isinstance(page_bytes, int)
            and 0 < l1_pages <= 2**31 - 1 and 0 < page_bytes and l1_pages * page_bytes <= 2**63 - 1):
        return None, None
    size = l1_pages * page_bytes
    try:
        pool = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, OverflowError, ValueError):
        return None, None
    probe = ctypes.c_char.from_buffer(pool)  # released at once: only the address is kept
    addr = ctypes.addressof(probe)
    del probe
    return pool, addr


class Cache:
    """One rank's cache (cpcache_open): at most one per process. Use as a context manager,
    or call close() in a finally block. A Cache dropped without close() is closed when it is
    garbage collected (with a ResourceWarning), once no memoryview of its L1 pool is left.
    close() releases the memoryviews l1_page() returned (see the module's "Memory views").

    In a child forked after the cache was opened, every call raises ForkedError at once
    (naming the parent's pid), and close() and the finalizer return at once without touching
    the library or the memory: the cache is the parent's, which keeps using it. Opening a
    Cache in such a child raises ForkedError too (see the module's "Fork")."""

    _h = None  # the handle, once open
    _closed = False
    _pool = None  # the L1 pool this module allocated (L1_ALLOC), an mmap
    _pid = None  # the process that opened it (a forked child must not close it)
    _runner = None  # the helper thread of interruptible collectives (_collective), once used
    _store_adapter = None  # the StoreAdapter made for store= (detached at close)
    _scratch = None  # match's output buffers, reused (see match)
    _ins_scratch = None  # insert_locs's

    def __init__(self, *, l1_pages=None, l2_pages, page_bytes=0, page_tokens=16, world=0, tp=0, dp=0,
                 attn_cp=0, ep=0, dp_attention=True, rank=-1, store=None, consensus=None,
                 timeout_ms=60000, slab_backend=SLAB_HOST, device=0, pin_host=False,
                 l1_kind=L1_ALLOC, l1_base=None, policy=WRITE_THROUGH, write_threshold=0,
                 min_load_pages=0, load_quota_pages=0, storage_url=None, model=None,
                 kv_layout=None, kv_layers=0, l1_buffers=None, l2_layout=None, l1_mode=None,
                 job_id=None, local_world=0, kv_events=None, kv_events_replay=None, kv_events_topic=None,
                 metrics_addr=None):
        """Opens this rank's cache (cpcache_open) [C: it waits for every rank of the job]. Every
        argument is keyword-only; all but l2_pages (and l1_pages, without l1_buffers) have
        defaults. The ranks of a job compare their configuration before anything is built and
        refuse a difference with ConfigError naming the argument and two ranks' values.

        The job and this rank's place in it (SGLang's rules; `cpcache layout` prints the groups):
        world: the number of ranks (0: the launcher's, from the environment); rank: this
        process's rank (-1: the launcher's: torchrun's RANK, OpenMPI's, Slurm's, or what
        `cpcache launch` sets); tp, dp, attn_cp, ep: tensor-, data-, attention-context- and
        expert-parallel sizes (tp 0: world; dp, attn_cp, ep 0: 1); dp_attention: each DP
        replica runs attention on its own ranks (needed for dp > 1). The CP group (attn_cp
        ranks) shares L2; the replica group (attn_cp × attn_tp ranks) makes the same calls.
        A rank started alone (world 1) needs no store.

        Where the ranks meet: store (below), job_id, local_world; consensus: the backend of the
        per-step collective, None or "auto" (shared memory when a replica is on one host, else
        Gloo), "shm" or "gloo" (None also reads $CPCACHE_CONSENSUS_BACKEND); timeout_ms: the
        deadline of the rendezvous, of each collective and each wait on the store (default
        60000).

        Pages: page_tokens (tokens per page, default 16); page_bytes: this rank's bytes of a
        page (its KV shard; 0 with a kv_layout: the layout's). L1: l1_pages slots of this
        rank's pool, which holds only the pages this rank owns (page i of a sequence is CP rank
        i mod attn_cp's); l1_kind: L1_ALLOC (the binding allocates host memory: l1_page gives
        its pages), L1_HOST or L1_DEVICE (l1_base is the engine's host memory or CUDA device
        pointer on `device`). L2: l2_pages pages in each slab (one slab per CP rank);
        slab_backend: SLAB_HOST (host shared memory) or SLAB_CUDA_IPC (device memory on
        `device`, one process per rank); pin_host: register host slabs with CUDA as pinned
        (needed with a device L1); device: the CUDA device ordinal.

        Policy: policy WRITE_THROUGH (default: every inserted page is backed up to L2 at the
        next step), WRITE_THROUGH_SELECTIVE (after write_threshold insertions, default 2) or
        WRITE_BACK (at L1 eviction); min_load_pages: load back host hits of at least this many
        pages (default 1); load_quota_pages: pages loading at once over the CP group (default:
        half of the group's L1, attn_cp × l1_pages / 2; see load_back).

        Storage (L3, optional): storage_url, file:///dir or redis://host:port/prefix (None:
        none); model names the KV content (with the page geometry and TP size it scopes the
        stored pages); the MAC key comes from $CPCACHE_STORAGE_KEY_FILE (a file store keeps
        its own beside its pages). Every rank gives the same.

        kv_layout: a preset name ("llama-3-8b", ...) or a spec ("layers=2;k=256:sharded;
        v=256:sharded"), or a list of (name, bytes_per_token, KV_SHARDED|KV_REPLICATED) parts
        with kv_layers; page_bytes 0 then takes the layout's. l1_buffers: the engine's L1 per
        (layer, part): L1Buffer values (token_slot_buffer, block_major_buffers) or
        (layer, part, array) token-slot tuples; they replace the pool. A torch CUDA tensor
        (.is_cuda) or an object with __cuda_array_interface__ is device memory (on `device`):
        with every buffer on the device, l1_kind L1_ALLOC becomes L1_DEVICE and the CUDA
        engine copies layer by layer (host slabs need pin_host=True; wait_l1_layer_on makes a
        stream wait for a layer); numpy arrays are host memory; the two do not mix. l2_layout:
        "page_first" (default) or "layer_first". l1_mode: "cache_owned" (default: insert and
        load_back pick the slots) or "engine_owned" (the engine's allocator picks them:
        insert_slots, load_back_slots, evict_l1_slots, take_freed_l1). l1_pages: required
        without l1_buffers; with them, None takes the smallest slot count among them. Each
        buffer's row (its non-token dimensions × element size, numpy and torch) must be its
        part's bytes per token on this rank, else InvalidError naming both (padded=True of the
        buffer helpers declares a wider row).

        store: the rendezvous every rank meets through: a URL (file:///dir, redis://host:port,
        or tcp://host:port of a torch TCPStore such as an engine's dist_init_method), or a
        store object: any torch.distributed.Store (TCPStore, FileStore, PrefixStore) or object
        with set/get/add/delete_key (see StoreAdapter); cpcache's keys live under "cpcache/".
        None: $CPCACHE_STORE. job_id: this job's id, the same on every rank of the job and
        different from any other job's on the same store (None: $CPCACHE_JOB_ID, else the
        launcher's). local_world: how many of the job's ranks run on this machine (with world
        and rank; local_world == world connects them over 127.0.0.1). Variables are read as
        os.environ is when the Cache opens.

        kv_events: an endpoint on which the first rank of each replica group publishes the
        replica's KV events as `cpcache run --kv-events` does (vLLM's ZMQ format; bound when
        its host is * or [::] or it is ipc:// or inproc://, else connected to a subscriber that
        binds; replica d on the tcp port plus d); kv_events_replay: the replay endpoint
        (bound); kv_events_topic: every message's first frame (default ""). Every rank gives
        the same. metrics_addr: "host:port" where this rank serves metrics_text() (plus the
        process's Go collectors) on /metrics over HTTP until close. A bad endpoint or address
        raises InvalidError naming it before any rank talks to another."""
        lib = library()
        bufs = None
        if l1_buffers:
            bufs = [b if isinstance(b, L1Buffer) else token_slot_buffer(b[0], b[1], b[2], page_tokens) for b in l1_buffers]
            if l1_pages is None:
                counts = [b.slots for b in bufs if b.slots is not None]
                if len(counts) != len(bufs):
                    raise _invalid("l1_pages is not given and an L1Buffer of l1_buffers does not say its slots: give l1_pages")
                l1_pages = min(counts)
        if l1_pages is None:
            raise _invalid("l1_pages is required (or l1_buffers, whose smallest slot count it then is)")
        cfg = _Config()
        _check(lib.cpcache_config_init(ctypes.byref(cfg)))
        types = dict(_Config._fields_)
        for name, value in (("world", world), ("tp", tp), ("dp", dp), ("attn_cp", attn_cp), ("ep", ep),
                            ("rank", rank), ("timeout_ms", timeout_ms), ("page_tokens", page_tokens),
                            ("page_bytes", page_bytes), ("slab_backend", slab_backend), ("device", device),
                            ("l2_pages", l2_pages), ("l1_kind", l1_kind), ("l1_pages", l1_pages),
                            ("policy", policy), ("write_threshold", write_threshold),
                            ("min_load_pages", min_load_pages), ("load_quota_pages", load_quota_pages)):
            _arg(name, value, types[name])
        cfg.world, cfg.tp, cfg.dp, cfg.attn_cp, cfg.ep = world, tp, dp, attn_cp, ep
        cfg.dp_attention, cfg.rank = int(bool(dp_attention)), rank
        cfg.store_url, adapter = _store_arg(store, timeout_ms)
        if adapter is not None:
            _STORE_ADAPTERS.append(adapter)
            cfg.store = ctypes.pointer(adapter.callbacks)
            if adapter is not store:
                self._store_adapter = adapter  # this cache's own: it lets the store go at close
        _arg("local_world", local_world, _i32)
        cfg.consensus, cfg.job_id, cfg.local_world = _bytes(consensus), _bytes(job_id), local_world
        cfg.kv_events_endpoint, cfg.kv_events_replay_endpoint = _bytes(kv_events), _bytes(kv_events_replay)
        cfg.kv_events_topic, cfg.metrics_addr = _bytes(kv_events_topic), _bytes(metrics_addr)
        cfg.timeout_ms, cfg.page_tokens, cfg.page_bytes = timeout_ms, page_tokens, page_bytes
        cfg.slab_backend, cfg.device, cfg.pin_host, cfg.l2_pages = slab_backend, device, int(pin_host), l2_pages
        self._views = {}  # id → weakref of each memoryview l1_page returned, until close
        self._views_lock = threading.Lock()
        pool = addr = None
        if l1_kind == L1_ALLOC and not l1_buffers:
            # Python owns the pool (see "Memory views"): the library maps it as the caller's.
            pool, addr = _alloc_pool(l1_pages, page_bytes)
            if pool is not None:
                l1_kind, l1_base = L1_HOST, addr
        cfg.l1_kind, cfg.l1_base, cfg.l1_pages = l1_kind, l1_base, l1_pages
        cfg.policy, cfg.write_threshold = policy, write_threshold
        cfg.min_load_pages, cfg.load_quota_pages = min_load_pages, load_quota_pages
        cfg.storage_url, cfg.model = _bytes(storage_url), _bytes(model)
        self._kv_keep = []  # ctypes arrays and the engine's buffers the library points into
        if isinstance(kv_layout, str):
            if kv_layers:
                raise _invalid(f"kv_layers {kv_layers!r} with kv_layout {kv_layout!r}: a preset or spec says its layers "
                               "(kv_layers goes with a list of parts)")
            cfg.kv_layout = _bytes(kv_layout)
        elif kv_layout is None:
            cfg.kv_num_layers = _arg("kv_layers", kv_layers, _i32)  # the library refuses layers without parts
        else:
            parts = (_KVPart * len(kv_layout))(*[_KVPart(_bytes(n), b, sh, 0) for n, b, sh in kv_layout])
            cfg.kv_parts, cfg.kv_num_parts, cfg.kv_num_layers = parts, len(kv_layout), kv_layers
            self._kv_keep.append(parts)
        if l2_layout not in _L2_LAYOUTS:
            raise InvalidError(-1, f"cpcache: l2_layout {l2_layout!r} (want 'page_first' or 'layer_first')")
        cfg.l2_layout = _L2_LAYOUTS[l2_layout]
        if l1_mode not in _L1_MODES:
            raise _invalid(f"l1_mode {l1_mode!r} (want 'cache_owned' or 'engine_owned')")
        cfg.l1_mode = _L1_MODES[l1_mode]
        if bufs:
            arr = (_L1Buffer * len(bufs))(*[_L1Buffer(b.layer, b.part, b.kind,
                                                      _arg(f"l1_buffers[{i}].token_bytes", b.token_bytes or 0, _i32),
                                                      b.base, b.bytes, b.page_stride, b.token_stride)
                                            for i, b in enumerate(bufs)])
            cfg.l1_buffers, cfg.l1_num_buffers = arr, len(bufs)
            self._kv_keep += [arr] + [b.owner for b in bufs]
            if pool is not None:  # the engine's buffers replace the pool
                pool.close()
                pool = addr = None
            for b in bufs:  # a CUDA tensor on another device than `device` cannot be copied there
                dev = getattr(b.owner, "device", None)
                index = getattr(dev, "index", None)
                if b.kind == MEM_DEVICE and getattr(dev, "type", None) == "cuda" and index is not None and index != device:
                    raise _invalid(f"l1_buffers: layer {b.layer} part {b.part} is a tensor on cuda:{index}, but device is {device}")
            # Host buffers replace the library's host pool (L1_ALLOC), device buffers the device
            # L1 pool (L1_DEVICE: the default here when every buffer is device memory). Any
            # other l1_kind or an l1_base goes to cpcache_open, which names what does not fit.
            if l1_kind == L1_ALLOC and all(b.kind == MEM_DEVICE for b in bufs):
                l1_kind = L1_DEVICE
            cfg.l1_kind, cfg.l1_base = l1_kind, l1_base
        self._lib = lib
        h = _u64()
        msg = None
        if _interruptible():
            def interrupted(done):
                # Cancel the rendezvous; wait (bounded) for the open to return, and close a
                # cache it opened meanwhile. An open that does not return in time keeps the
                # pool (the library may still write it).
                lib.cpcache_abort(0)
                if done.acquire(timeout=5):
                    if h.value:
                        lib.cpcache_close(h.value)
                    if pool is not None:
                        pool.close()
            status, msg = _call_interruptibly(lib.cpcache_open, (ctypes.byref(cfg), ctypes.byref(h)), interrupted)
        else:
            status = lib.cpcache_open(ctypes.byref(cfg), ctypes.byref(h))
        if status != 0 and pool is not None:
            pool.close()
        if status != 0 and self._store_adapter is not None:
            self._store_adapter.detach()
        if status != 0:
            if msg is None:
                msg = lib.cpcache_last_error()
            c_msg = (msg or b"").decode(errors="replace")
            err = _ERRORS.get(status, Error)(status, _python_terms(c_msg))
            err.c_message = c_msg  # the library's own words (C field names)
            raise err
        self._h, self._pool, self._pool_base, self._pid = h.value, pool, addr, os.getpid()
        try:
            info = _Info(struct_size=ctypes.sizeof(_Info))
            _check(lib.cpcache_get_info(self._h, ctypes.byref(info)))
            self.info = Info(**{f: getattr(info, f) for f in Info._fields})
            self._pt = int(info.page_tokens)
        except BaseException:
            self._closed = True
            lib.cpcache_close(self._h)  # else the process's one cache stays open, unreachable
            raise

    def kv_bytes_per_token(self):
        """This rank's KV bytes per token (all layers and parts) [L]; InvalidError without a layout."""
        out = _i64()
        _check(self._lib.cpcache_kv_bytes_per_token(self._h, ctypes.byref(out)))
        return out.value

    def kv_page_bytes(self):
        """This rank's KV bytes per page [L]; InvalidError without a layout."""
        out = _i64()
        _check(self._lib.cpcache_kv_page_bytes(self._h, ctypes.byref(out)))
        return out.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Releases the cache (idempotent) [L], then the memoryviews l1_page returned (using
        one afterwards raises ValueError) and the L1 pool this module allocated. In a child
        forked after the cache was opened it returns at once and releases nothing: the cache,
        its pool and its views are the parent's (the child's copies go when it exits)."""
        if self._pid != os.getpid():
            self._closed = True
            return
        self._closed = True  # released even when close reports an error
        try:
            _check(self._lib.cpcache_close(self._h))
        finally:
            self._stop_runner()
            self._release_memory()
            if self._store_adapter is not None:
                self._store_adapter.detach()

    def _stop_runner(self):
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop()

    def _release_memory(self):
        """After cpcache_close (the library no longer touches the pool): releases every view
        l1_page returned, then unmaps the pool unless a buffer derived from a view is alive,
        which then keeps it mapped (detached from any cache) until it goes."""
        with self._views_lock:
            views, self._views = self._views, {}
            pool, self._pool = self._pool, None
        kept = 0
        for ref in views.values():
            view = ref()
            if view is None:
                continue
            try:
                view.release()
            except BufferError:  # a buffer (numpy, ctypes) was taken from this very view
                kept += 1
        if pool is not None:
            try:
                pool.close()
            except BufferError:  # slices or buffers over a view are alive
                kept += 1
        if kept:
            try:
                warnings.warn(f"cpcache: cache {self._h} closed while buffers derived from its l1_page views "
                              "(slices, numpy arrays) are alive: they keep its L1 memory, detached from any "
                              "cache, until they go", ResourceWarning, stacklevel=3)
            except Exception:  # interpreter shutdown
                pass

    def __del__(self):
        # Dropped without close(): the process's one cache would stay open, unreachable. In a
        # forked child the cache is the parent's: nothing to do.
        if self._h is None or self._closed or self._pid != os.getpid():
            return
        self._closed = True
        try:
            warnings.warn(f"cpcache: cache {self._h} was not closed; call close() or use `with`",
                          ResourceWarning, source=self)
        except Exception:  # interpreter shutdown
            pass
        self._lib.cpcache_close(self._h)
        self._stop_runner()
        self._release_memory()

    def match(self, tokens, key=None, out=None):
        """The longest prefix cached under isolation key key (bytes or str, None or empty:
        the empty key; see insert) [R]: a MatchResult. l1_slots are this rank's slots of the
        device pages (a list): -1 for a page it does not own (page i is CP rank i mod cp_size's; each
        rank's L1 holds only its own pages); device_indices the same per token (location
        slot * page_tokens + k, -1 for another rank's token), an int64 numpy array, or a torch
        tensor when out="torch" or tokens is one (out="numpy" forces numpy). tokens: a list,
        array('i'), or a numpy array / torch tensor of integers (int32 passes without a copy)."""
        ptr, n, keep = _int_ptr(tokens, "token", 4)
        k = _key(key)
        pt = self._pt
        pages = n // pt
        # The library writes into a scratch pair kept between calls (taken off the cache while
        # in use, so that two threads never share one); the result copies what it needs.
        scratch, self._scratch = self._scratch, None
        if scratch is None or scratch[0] < pages:
            cap = max(pages, 256)
            scratch = (cap, (_i64 * (cap * pt))(), (_i32 * cap)(), _MatchResult())
        _, locs, slots, res = scratch
        try:
            _check(self._lib.cpcache_match_locs(self._h, k, len(k), ptr, n, ctypes.byref(res), locs, pages * pt, slots,
                                                pages))
            dp = res.device_pages
            return MatchResult(res.node, dp, res.host_pages, slots[:dp],
                               _locs_copy(locs, dp * pt,
                                          out is not None and _want_torch(out) or out is None and _is_torch(tokens)),
                               dp * pt, res.host_pages * pt)
        finally:
            self._scratch = scratch

    def lock(self, node):
        """Pins node's prefix [R]."""
        _check(self._lib.cpcache_lock(self._h, _arg("node", node, _u64)))

    def unlock(self, node):
        """Releases a lock [R]."""
        _check(self._lib.cpcache_unlock(self._h, _arg("node", node, _u64)))

    def load_back(self, node):
        """Allocates L1 slots for node's L2-only pages; their copies start at the next step.
        Returns the pages that will load [R]: the leading host pages of the match, at most the
        load quota left (load_quota_pages; by default half of the CP group's L1, attn_cp ×
        l1_pages / 2, minus the pages loading) and what L1 can free; 0 below min_load_pages,
        L1FullError when L1 cannot make room for min_load_pages. With l1_pages 32: at CP1 a
        20-page host hit loads 16, then 4 at the next call; at CP4 an 80-page one loads 64,
        then 16."""
        pages = _i64()
        _check(self._lib.cpcache_load_back(self._h, _arg("node", node, _u64), ctypes.byref(pages)))
        return pages.value

    def load_pending(self, node):
        """Whether the group has not yet agreed that the loads on node's prefix are over [R].
        The loads' copies start only at the next step(), and the group agrees they are over
        only at a later one: a wait loop must call step() (`while c.load_pending(n): c.step()`);
        without it, it never ends (and the cache warns once, see step())."""
        p = _i32()
        _check(self._lib.cpcache_load_pending(self._h, _arg("node", node, _u64), ctypes.byref(p)))
        return bool(p.value)

    def wait_l1(self, node, timeout_ms=-1):
        """Waits for this rank's loads on node's prefix, after the step that starts them [L]."""
        _check(self._lib.cpcache_wait_l1(self._h, _arg("node", node, _u64), _arg("timeout_ms", timeout_ms, _i64)))

    def wait_l1_layer(self, node, layer, timeout_ms=-1):
        """wait_l1 for one layer: waits until layer `layer` of this rank's loads on node's
        prefix landed in L1, so that the layer's attention runs while later layers still copy
        (with an engine that loads whole pages: the whole load). NotStartedError before the
        step that starts the loads; InvalidError for a negative layer or one past a
        layer-wise load's layers [L]."""
        _check(self._lib.cpcache_wait_l1_layer(self._h, _arg("node", node, _u64), _arg("layer", layer, _i32),
                                               _arg("timeout_ms", timeout_ms, _i64)))

    def wait_l1_layer_on(self, node, layer, stream=0):
        """Makes the CUDA stream `stream` wait for layer `layer` of the loads on node's prefix
        without blocking this thread (a device L1 only): kernels enqueued on it afterwards read
        the loaded layer. stream: a CUstream handle as an int (0: the legacy default stream), or
        an object with a cuda_stream attribute (torch.cuda.Stream). ConfigError when the
        cache's L1 is not device memory (use wait_l1_layer) [L]."""
        handle = getattr(stream, "cuda_stream", stream)
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise _invalid(f"stream {stream!r} is neither a CUstream handle (int) nor has a cuda_stream")
        if not 0 <= handle < 1 << (8 * ctypes.sizeof(ctypes.c_void_p)):
            raise _invalid(f"stream {handle!r} is out of range for a pointer")
        _check(self._lib.cpcache_wait_l1_layer_on(self._h, _arg("node", node, _u64), _arg("layer", layer, _i32),
                                                  handle))

    def insert(self, tokens, key=None):
        """Caches tokens' whole pages under isolation key key; the owner of each fill page
        writes its KV [R]. The key (bytes, or str as UTF-8; at most 4096 bytes) seeds the page
        hashes, so equal tokens under different keys share no page in L1, L2 or storage
        (a tenant, or a LoRA adapter, matches only its own pages); None or empty is the
        empty key. Page ids are SHA-256 chained over the prefix and the key; FillPage.hash
        is the first 8 bytes of the page's id (little endian): an index, not an identity."""
        arr, n = _tokens(tokens)
        k = _key(key)
        cap = n // self.info.page_tokens
        fill = (_FillPage * max(cap, 1))()
        res = _InsertResult()
        _check(self._lib.cpcache_insert_key(self._h, k, len(k), arr, n, ctypes.byref(res), fill, cap))
        pages = [FillPage(f.slot, f.owner, f.index, f.hash, bool(f.owned)) for f in fill[:res.n_fill]]
        return InsertResult(res.node, res.pages, pages, res.backups)

    def evict_l1(self, pages):
        """Evicts up to pages L1 pages, never more; returns Evicted(freed, pending): the
        pages freed now, and (write_back) those whose backup is in flight, freed at the step
        that commits it. Pages still pending from earlier calls count toward pages, so a
        repeated request starts no more: freed + pending <= pages (cpcache_evict_l1_ex). Pages
        whose backup has not started (it starts at the next step()) are neither: without a
        step(), Evicted(0, 0) [R]."""
        freed, pending = _i64(), _i64()
        _check(self._lib.cpcache_evict_l1_ex(self._h, _arg("pages", pages, _i64), ctypes.byref(freed),
                                             ctypes.byref(pending)))
        return Evicted(freed.value, pending.value)

    # --- engine-owned L1 slots (l1_mode="engine_owned"; see cpcache.h) ---
    # Slot lists are lists of ints or int32 buffers (numpy int32 arrays); freed slots come
    # back as lists of ints, all of them (the buffer holds a whole L1 pool's worth).

    def _freed_buf(self):
        cap = max(int(self.info.l1_pages), 1)
        return (_i32 * cap)(), cap, ctypes.c_size_t()

    def _freed_list(self, buf, cap, n):
        out = list(buf[:min(n.value, cap)])
        if n.value > cap:  # cannot happen (a rank frees at most its pool), but lose nothing
            out += self.take_freed_l1()
        return out

    def insert_slots(self, tokens, slots, key=None):
        """insert (under isolation key key) with this rank's slots: one for every whole page of
        tokens this rank owns (page i is CP rank i mod cp_size's), in order, holding the KV the
        engine computed. Returns SlotsInserted; a bad slot list is InvalidError naming the
        slot, before any change [R]."""
        arr, n = _tokens(tokens)
        own, n_own = _tokens(slots, "slot")
        k = _key(key)
        res = _InsertResult()
        buf, cap, nf = self._freed_buf()
        _check(self._lib.cpcache_insert_slots(self._h, k, len(k), arr, n, own, n_own, ctypes.byref(res), buf, cap,
                                              ctypes.byref(nf)))
        return SlotsInserted(res.node, res.pages, res.backups, self._freed_list(buf, cap, nf))

    def load_back_plan(self, node):
        """The sequence pages this rank owns that load_back_slots(node, ...) would load at
        most, in order: it wants one slot for each [L; the same plan on every rank]."""
        h = _arg("node", node, _u64)
        n = ctypes.c_size_t()
        _check(self._lib.cpcache_load_back_plan(self._h, h, None, 0, ctypes.byref(n)))
        pages = (_i64 * max(n.value, 1))()
        _check(self._lib.cpcache_load_back_plan(self._h, h, pages, n.value, ctypes.byref(n)))
        return list(pages[:n.value])

    def load_back_slots(self, node, slots):
        """load_back into the engine's slots, one for each page load_back_plan(node) lists.
        Returns SlotsLoaded [R]."""
        own, n_own = _tokens(slots, "slot")
        pages = _i64()
        buf, cap, nf = self._freed_buf()
        _check(self._lib.cpcache_load_back_slots(self._h, _arg("node", node, _u64), own, n_own, ctypes.byref(pages),
                                                 buf, cap, ctypes.byref(nf)))
        return SlotsLoaded(pages.value, self._freed_list(buf, cap, nf))

    def evict_l1_slots(self, pages):
        """evict_l1 that also returns this rank's slots freed now: SlotsEvicted [R]."""
        freed, pending = _i64(), _i64()
        buf, cap, nf = self._freed_buf()
        _check(self._lib.cpcache_evict_l1_slots(self._h, _arg("pages", pages, _i64), ctypes.byref(freed),
                                                ctypes.byref(pending), buf, cap, ctypes.byref(nf)))
        return SlotsEvicted(freed.value, pending.value, self._freed_list(buf, cap, nf))

    def l1_used_by(self, cp_rank):
        """The L1 slots in use on CP rank cp_rank: equal on every rank (replicated), so an
        engine decides from it alike everywhere whether every allocator has room for its pages
        (l1_pages - used) and calls evict_l1_slots first when not [L]."""
        used = _i64()
        _check(self._lib.cpcache_l1_used_by(self._h, _arg("cp_rank", cp_rank, _i32), ctypes.byref(used)))
        return used.value

    def take_freed_l1(self):
        """This rank's slots the cache let go outside a call that returns them (write-back
        evictions committed at a step, quarantine, recovery, flush): drain after every step
        and flush, for the engine's allocator. [] in cache-owned mode [L]."""
        out = []
        buf, cap, nf = self._freed_buf()
        while True:
            _check(self._lib.cpcache_take_freed_l1(self._h, buf, cap, ctypes.byref(nf)))
            out += buf[:min(nf.value, cap)]
            if nf.value <= cap:
                return out

    # --- token locations (l1_mode="engine_owned", SGLang's out_cache_loc; see cpcache.h) ---
    # Page slot s holds locations s*page_tokens .. s*page_tokens+page_tokens-1 of this rank's
    # buffers (token_slot_buffer's layout); another CP rank's token is -1 here. Location
    # arrays in: int64 numpy arrays or torch tensors (by address, no copy), other integer
    # arrays or lists (converted). Out: int64 numpy arrays, or torch tensors when out="torch"
    # (or, with out=None, when the input array is a tensor).

    def _take_rest(self, first, n, cap, torch):
        """first (a freed-locations result of cap entries of n freed) completed with the
        queued rest (n > cap: more than the call's buffer held)."""
        if n <= cap:
            return first
        rest = self.take_freed_locs(out="torch" if torch else "numpy")
        np = _numpy()
        if torch:
            import torch as _torch
            return _torch.cat([first, rest])
        if np is not None:
            return np.concatenate([first, rest])
        return first + rest

    def _freed_cap(self, tokens):
        return max(tokens, 64 * self._pt)

    def insert_locs(self, tokens, locs, key=None, out=None, kept=None):
        """insert (under isolation key key) with the request's per-token locations: locs[i]
        is token i's location on this rank (SGLang's req_to_token row; entries of other ranks'
        pages, e.g. -1, and of the partial last page are not read). The cache adopts this
        rank's whole pages, whose locations must be page-aligned and contiguous (else
        InvalidError naming the entry and its value, before any change). Returns LocsInserted,
        whose freed (int64 array) are the locations it does not keep: give them back to the
        allocator [R]. kept: None, or a writable C-contiguous int64 numpy array or CPU torch
        tensor (locs itself, say) of at least the whole pages' tokens: after the insert the
        cache's locations of the sequence's device hit are written there, as match() gives
        them, LocsInserted.kept_tokens says how many and node is that match's (SGLang's write
        of the cache's indices into the request's row, in the same call)."""
        ptr, n, keep = _int_ptr(tokens, "token", 4)
        lptr, nl, lkeep = _int_ptr(locs, "location", 8)
        k = _key(key)
        whole = n // self._pt * self._pt
        kptr = kcap = nk = None
        if kept is not None:
            kptr, kcap = _out_ptr(kept, "kept")
            nk = ctypes.c_size_t()
        # The freed locations land in a scratch buffer kept between calls (as match's).
        scratch, self._ins_scratch = self._ins_scratch, None
        if scratch is None or scratch[0] < whole:
            cap = self._freed_cap(whole)
            scratch = (cap, (_i64 * cap)(), _InsertResult(), ctypes.c_size_t())
        cap, buf, res, nf = scratch
        try:
            _check(self._lib.cpcache_insert_locs(self._h, k, len(k), ptr, n, lptr, nl, ctypes.byref(res), buf, cap,
                                                 ctypes.byref(nf), kptr, kcap or 0,
                                                 nk if nk is None else ctypes.byref(nk)))
            torch = _want_torch(out, locs)
            freed = self._take_rest(_locs_copy(buf, min(nf.value, cap), torch), nf.value, cap, torch)
            return LocsInserted(res.node, res.pages, res.backups, freed, nk.value if nk is not None else 0)
        finally:
            self._ins_scratch = scratch

    def load_back_tokens(self, node):
        """How many locations load_back_locs(node, ...) wants: page_tokens for each page of
        load_back_plan(node) [L; the same plan on every rank]."""
        return len(self.load_back_plan(node)) * self._pt

    def load_back_locs(self, node, locs, out=None):
        """load_back into the engine's locations: load_back_tokens(node) of them, page_tokens
        page-aligned contiguous ones for each page of load_back_plan(node), in order. Returns
        LocsLoaded; its freed are the locations of pages that did not load and those the
        load's evictions freed [R]."""
        lptr, nl, lkeep = _int_ptr(locs, "location", 8)
        pages = _i64()
        cap = self._freed_cap(nl)
        buf, nf = (_i64 * cap)(), ctypes.c_size_t()
        _check(self._lib.cpcache_load_back_locs(self._h, _arg("node", node, _u64), lptr, nl, ctypes.byref(pages),
                                                buf, cap, ctypes.byref(nf)))
        torch = _want_torch(out, locs)
        freed = self._take_rest(_locs_out(buf, min(nf.value, cap), torch), nf.value, cap, torch)
        return LocsLoaded(pages.value, pages.value * self._pt, freed)

    def evict_locs(self, tokens, out=None):
        """Evicts L1 pages for at least tokens tokens (ceil(tokens / page_tokens) pages, as
        evict_l1_slots): LocsEvicted(freed_tokens, pending_tokens, freed), freed this rank's
        locations freed now [R]."""
        ft, pt_, nf = _i64(), _i64(), ctypes.c_size_t()
        cap = self._freed_cap(min(int(tokens), int(self.info.l1_pages) * self._pt) if tokens > 0 else 0)
        buf = (_i64 * cap)()
        _check(self._lib.cpcache_evict_locs(self._h, _arg("tokens", tokens, _i64), ctypes.byref(ft), ctypes.byref(pt_),
                                            buf, cap, ctypes.byref(nf)))
        torch = _want_torch(out)
        freed = self._take_rest(_locs_out(buf, min(nf.value, cap), torch), nf.value, cap, torch)
        return LocsEvicted(ft.value, pt_.value, freed)

    def take_freed_locs(self, out=None):
        """take_freed_l1 in locations: an int64 array of this rank's locations the cache let
        go outside a call that returns them; drain after every step and flush [L]."""
        nf = ctypes.c_size_t()
        _check(self._lib.cpcache_take_freed_locs(self._h, None, 0, ctypes.byref(nf)))
        cap = max(nf.value, 1)
        buf = (_i64 * cap)()
        _check(self._lib.cpcache_take_freed_locs(self._h, buf, cap, ctypes.byref(nf)))
        return _locs_out(buf, min(nf.value, cap), _want_torch(out))

    def make_room(self, end, start=0, reserved=None, out=None):
        """The agreed cross-rank eviction that makes room for a request [R]: evicts (least
        recently used first) until every CP rank has room for the pages it owns among the
        sequence's tokens [start, end) — from page start // page_tokens (start: the device
        hit) to the page holding token end-1 — beside the pages the cache holds on it and
        reserved[r] pages the engine holds outside the cache on CP rank r (cp_size ints, the
        same on every rank; None: none). Decided from replicated counts, so every rank evicts
        alike. Returns RoomMade(room, freed): room False when nothing more can be evicted
        (locked pages, backups in flight: step and retry); freed, this rank's freed locations
        (int64 array), for the allocator either way."""
        res_arr = None
        if reserved is not None:
            cp = self.info.cp_size
            if len(reserved) != cp:
                raise _invalid(f"reserved has {len(reserved)} entries, want cp_size {cp}")
            res_arr = (_i64 * cp)(*[_arg(f"reserved[{r}]", int(v), _i64) for r, v in enumerate(reserved)])
        room, nf = _i32(), ctypes.c_size_t()
        cap = self._freed_cap(0)
        buf = (_i64 * cap)()
        _check(self._lib.cpcache_make_room(self._h, _arg("start", start, _i64), _arg("end", end, _i64), res_arr,
                                           ctypes.byref(room), buf, cap, ctypes.byref(nf)))
        torch = _want_torch(out)
        freed = self._take_rest(_locs_out(buf, min(nf.value, cap), torch), nf.value, cap, torch)
        return RoomMade(bool(room.value), freed)

    def evict_l2(self, pages):
        """Frees up to pages L2 pages of L2-only nodes; returns how many [R]."""
        freed = _i64()
        _check(self._lib.cpcache_evict_l2(self._h, _arg("pages", pages, _i64), ctypes.byref(freed)))
        return freed.value

    def _collective(self, fn):
        """fn(handle), a call that may wait for peers (step, flush). From the main thread with
        Python's SIGINT handler it runs on a helper thread, so that Ctrl-C raises
        KeyboardInterrupt at once even while a peer is late: the cache is then aborted
        (cpcache_abort: the collective returns, this rank leaves, its peers see it lost as when
        it closes) and closed; anything else calls the library directly."""
        if self._closed or not _interruptible():
            _check(fn(self._h))  # a forked child: ForkedError at once; closed: ClosedError
            return
        if self._runner is None:
            self._runner = _Runner()
        _check(*self._runner.call(fn, (self._h,), self._abort))

    def _abort(self, done=None):
        """Aborts the cache after an interrupt: cpcache_abort on a helper thread, waited for
        a moment (a Gloo collective cannot be cancelled once started: its close waits for it,
        at most timeout_ms, and the memory is released after it, on that thread)."""
        if self._closed or self._pid != os.getpid():
            return
        self._closed = True

        def run():
            self._lib.cpcache_abort(self._h)
            self._stop_runner()
            self._release_memory()

        t = threading.Thread(target=run, name=f"cpcache-abort-{self._h}", daemon=True)
        t.start()
        t.join(0.05)

    def step(self):
        """The consensus step: once per scheduler step, on every rank, the same number of
        times [R]. Copies (backups, load-backs) and storage I/O start only at a step; when
        they stay pending longer than CPCACHE_STEP_WARN_MS (default 5000 ms; 0: never) with
        no step(), the library logs a warning naming step() on stderr (once per cache) and
        stats()["no_step_warnings"] counts it. A rank that calls step() more often than its
        peers gets an error naming the counts: DivergedError when its extra step met the
        peers' next one (the calls each made since its previous step), or, while it waits for
        peers that make no further step, TimeoutError_/PeerLostError naming each rank's
        count of step() calls. Ctrl-C while it waits for a late peer raises
        KeyboardInterrupt at once and aborts the cache (see _collective)."""
        self._collective(self._lib.cpcache_step)

    def pending(self):
        """Transfers and storage operations in flight (replicated) [R]."""
        n = _i64()
        _check(self._lib.cpcache_pending(self._h, ctypes.byref(n)))
        return n.value

    def flush(self):
        """Empties the cache when idle, else BusyError [R, collective]. Interruptible as step."""
        self._collective(self._lib.cpcache_flush)

    def prefetch(self, tokens, key=None):
        """Asks storage for the continuation of tokens under isolation key key (see insert);
        returns the id (0: nothing asked) [R]."""
        arr, n = _tokens(tokens)
        k = _key(key)
        pid = _u64()
        _check(self._lib.cpcache_prefetch_key(self._h, k, len(k), arr, n, ctypes.byref(pid)))
        return pid.value

    def prefetch_pending(self, pid):
        """Whether prefetch pid is still running [R]."""
        p = _i32()
        _check(self._lib.cpcache_prefetch_pending(self._h, _arg("pid", pid, _u64), ctypes.byref(p)))
        return bool(p.value)

    def prefetch_revoke(self, pid):
        """Stops waiting for prefetch pid (cpcache_prefetch_revoke) [R]: under the best-effort
        and timeout prefetch policies the next step inserts the prefix every rank has read of
        its own pages (none when revoked before its query was answered), and
        prefetch_pending(pid) turns false once the group agreed the reads stopped. A pid that
        is over, or 0, changes nothing."""
        _check(self._lib.cpcache_prefetch_revoke(self._h, _arg("pid", pid, _u64)))

    def l1_page(self, slot):
        """A writable memoryview of L1 slot's bytes (host L1 only) [L]. close() releases it:
        using it afterwards raises ValueError (see the module's "Memory views")."""
        addr, size = ctypes.c_void_p(), ctypes.c_size_t()
        _check(self._lib.cpcache_l1_page(self._h, _arg("slot", slot, _i32), ctypes.byref(addr), ctypes.byref(size)))
        with self._views_lock:
            if self._closed:  # closed by another thread since the call above
                raise ClosedError(-4, f"cpcache: cache handle {self._h} is not open")
            if self._pool is not None:
                # A view of the pool's own buffer: while it, or anything derived from it,
                # is alive the pool cannot be unmapped (mmap refuses to close).
                page = (ctypes.c_ubyte * size.value).from_buffer(self._pool, addr.value - self._pool_base)
            else:
                page = (ctypes.c_ubyte * size.value).from_address(addr.value)
            page._cache = self  # the view keeps the cache from being collected
            with memoryview(page) as raw:
                view = raw.cast("B")
            views = self._views
            key = id(view)
            views[key] = weakref.ref(view, lambda _, views=views, key=key: views.pop(key, None))
        return view


    def metrics_text(self):
        """This rank's metrics in Prometheus' text exposition format, a str [L]: the cpcache_*
        series (stats()'s counters and more, labelled rank, replica and slab_group; on a
        replica's publishing rank the KV event publisher's cpcache_run_kv_event_*)."""
        n = ctypes.c_size_t()
        cap = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            status = self._lib.cpcache_metrics_text(self._h, buf, cap, ctypes.byref(n))
            if status == -2 and n.value + 1 > cap:  # CPCACHE_ERR_SIZE: the text grew past cap
                cap = n.value + 1 + 4096
                continue
            _check(status)
            return buf.raw[:n.value].decode()

    def stats(self):
        """The counters, as a dict [L]."""
        st = _Stats(struct_size=ctypes.sizeof(_Stats))
        _check(self._lib.cpcache_get_stats(self._h, ctypes.byref(st)))
        return {f: getattr(st, f) for f in _STATS_FIELDS}
