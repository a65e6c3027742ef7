"""ABI 2 through the Python binding: KV layouts and the engine's per-layer L1 buffers (numpy
arrays, and torch tensors where torch imports)."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

# 2 layers, K and V of 16 bytes a token each: 64 bytes a token, 256 a page of 4 tokens.
SPEC = "layers=2;k=16:sharded;v=16:sharded"
PAGE_TOKENS, L1_PAGES = 4, 8


def one_rank(tmp_path, **kw):
    args = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=PAGE_TOKENS, l1_pages=L1_PAGES, l2_pages=16)
    args.update(kw)
    return cpcache.Cache(**args)


def test_abi_version_is_three():
    assert cpcache.ABI_VERSION == 3 and cpcache.library().cpcache_abi_version() == 3


def test_layout_sizes_and_derived_page_bytes(tmp_path):
    with one_rank(tmp_path, kv_layout=SPEC) as c:
        assert c.kv_bytes_per_token() == 64 and c.kv_page_bytes() == 256
        assert c.info.page_bytes == 256  # page_bytes 0 took the layout's
    parts = [("k", 16, cpcache.KV_SHARDED), ("v", 16, cpcache.KV_SHARDED)]
    with one_rank(tmp_path, kv_layout=parts, kv_layers=2) as c:
        assert c.kv_page_bytes() == 256


def test_bad_layouts_name_the_bad_value(tmp_path):
    with pytest.raises(cpcache.InvalidError, match="no-such-model"):
        one_rank(tmp_path, kv_layout="no-such-model")
    with pytest.raises(cpcache.InvalidError, match=r'kv_layout\[1\] \("v"\): sharding 5'):
        one_rank(tmp_path, kv_layout=[("k", 16, cpcache.KV_SHARDED), ("v", 16, 5)], kv_layers=2)
    with pytest.raises(cpcache.InvalidError, match="page_bytes 64"):
        one_rank(tmp_path, kv_layout=SPEC, page_bytes=64)
    with pytest.raises(cpcache.InvalidError, match="l2_layout"):
        one_rank(tmp_path, kv_layout=SPEC, l2_layout="sideways")
    with one_rank(tmp_path, page_bytes=64) as c:
        with pytest.raises(cpcache.InvalidError, match="no KV layout"):
            c.kv_page_bytes()


def _token_slot_arrays(np):
    return {(l, j): np.zeros((L1_PAGES * PAGE_TOKENS, 2, 8), dtype=np.uint8) for l in range(2) for j in range(2)}


def _run_buffers(tmp_path, bufs, arrays, np, l2_layout):
    """Insert a sequence, write each fill page's KV into the engine's arrays, evict it to L2,
    load it back into other slots and check every byte landed in its layer and part."""
    with one_rank(tmp_path, kv_layout=SPEC, l1_buffers=bufs, l2_layout=l2_layout, write_threshold=1) as c:
        with pytest.raises(cpcache.InvalidError, match="no L1 pool: the L1 is the engine's per-layer l1_buffers"):
            c.l1_page(0)
        tokens = list(range(100, 100 + 2 * PAGE_TOKENS))
        res = c.insert(tokens)
        want = {}
        for p in res.fill:
            for (l, j), a in arrays.items():
                v = np.full(a[0].shape, 1 + p.index * 16 + l * 4 + j, dtype=np.uint8)
                for t in range(PAGE_TOKENS):
                    a[p.slot * PAGE_TOKENS + t] = v
                want[(p.index, l, j)] = v
        while c.pending():
            c.step()
        for a in arrays.values():
            a[:] = 0
        assert c.evict_l1(2).freed == 2
        m = c.match(tokens)
        assert m.device_pages == 0 and m.host_pages == 2, m
        c.lock(m.node)
        assert c.load_back(m.node) == 2
        while c.load_pending(m.node):
            c.step()
        m = c.match(tokens)
        c.wait_l1(m.node)
        for i, slot in enumerate(m.l1_slots):
            for (l, j), a in arrays.items():
                for t in range(PAGE_TOKENS):
                    assert (a[slot * PAGE_TOKENS + t] == want[(i, l, j)]).all(), (i, l, j, t)
        c.unlock(m.node)


@pytest.mark.parametrize("l2_layout", ["page_first", "layer_first"])
def test_numpy_token_slot_buffers_carry_every_layer_and_part(tmp_path, l2_layout):
    np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    arrays = _token_slot_arrays(np)
    bufs = [(l, j, a) for (l, j), a in arrays.items()]
    _run_buffers(tmp_path, bufs, arrays, np, l2_layout)


def test_numpy_block_major_buffers_are_k_and_v_of_one_tensor(tmp_path):
    np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    layers = [np.zeros((L1_PAGES, 2, PAGE_TOKENS, 2, 8), dtype=np.uint8) for _ in range(2)]
    bufs = [b for l, t in enumerate(layers) for b in cpcache.block_major_buffers(l, t)]
    assert bufs[0].page_stride == 2 * PAGE_TOKENS * 16 and bufs[1].base - bufs[0].base == PAGE_TOKENS * 16
    with one_rank(tmp_path, kv_layout=SPEC, l1_buffers=bufs) as c:
        assert c.kv_page_bytes() == 256


def test_bad_buffers_name_the_layer_and_part(tmp_path):
    np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    arrays = _token_slot_arrays(np)
    arrays[(1, 1)] = np.zeros(((L1_PAGES - 1) * PAGE_TOKENS, 2, 8), dtype=np.uint8)  # a slot short
    with pytest.raises(cpcache.InvalidError, match=r"layer 1.*part 1|part 1.*layer 1"):
        one_rank(tmp_path, kv_layout=SPEC, l1_buffers=[(l, j, a) for (l, j), a in arrays.items()])
    arrays = _token_slot_arrays(np)
    bufs = [(l, j, a) for (l, j), a in arrays.items() if (l, j) != (0, 1)]
    with pytest.raises(cpcache.InvalidError, match="layer 0.*part 1|part 1.*layer 0"):
        one_rank(tmp_path, kv_layout=SPEC, l1_buffers=bufs)


def test_torch_token_slot_buffers(tmp_path):
    try:
        import torch
    except Exception as e:  # noqa: BLE001 — any import failure means no torch here
        pytest.skip(f"torch does not import (Debian python3-torch): {e}")
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    tensors = {(l, j): torch.zeros((L1_PAGES * PAGE_TOKENS, 2, 8), dtype=torch.uint8) for l in range(2) for j in range(2)}
    arrays = {k: t.numpy() for k, t in tensors.items()}  # views of the same memory, for the checks
    _run_buffers(tmp_path, [(l, j, t) for (l, j), t in tensors.items()], arrays, np, "page_first")


@pytest.mark.parametrize("l2_layout", ["page_first", "layer_first"])
def test_example_with_per_layer_numpy_buffers_under_launch(l2_layout):
    """The Python example lends per-layer K/V numpy arrays on 4 CP ranks: every page read
    back from L2 holds its bytes in every layer and part."""
    import re
    import shutil
    import subprocess
    pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    binary = os.environ.get("CPCACHE_BIN") or os.path.join(ROOT, "bin", "cpcache")
    if not os.access(binary, os.X_OK):
        binary = shutil.which("cpcache") or binary
    example = os.path.join(ROOT, "python", "examples", "hicache_controller.py")
    out = subprocess.run([binary, "launch", "-n", "4", "--", sys.executable, example, "--attn-cp", "4",
                          "--kv-buffers", "--l2-layout", l2_layout], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [line for line in out.stdout.splitlines() if "requests=" in line]
    assert len(reports) == 4, out.stdout
    for line in reports:
        kv = dict(re.findall(r"(\w+)=([\d.]+)", line))
        assert kv["bad_pages"] == "0" and kv["digest_mismatches"] == "0", line
        assert int(kv["pages_verified"]) > 0 and int(kv["tokens_hit_l2"]) > 0, line


def test_an_abi1_config_opens_with_the_new_fields_defaulted(tmp_path):
    """A caller built against the ABI-1 header: the old struct (every field before kv_layout),
    struct_size its size, abi_version 1. It opens; the old size with abi_version 2 does not."""
    import ctypes
    names = [f[0] for f in cpcache._Config._fields_]
    abi1_fields = cpcache._Config._fields_[:names.index("kv_layout")]  # ABI 2 added kv_layout on

    class OldConfig(ctypes.Structure):
        _fields_ = abi1_fields

    lib = cpcache.library()
    full = cpcache._Config()
    assert lib.cpcache_config_init(ctypes.byref(full)) == 0
    old = OldConfig()
    ctypes.memmove(ctypes.byref(old), ctypes.byref(full), ctypes.sizeof(OldConfig))
    old.world, old.rank, old.store_url = 1, 0, f"file://{tmp_path}".encode()
    old.page_tokens, old.page_bytes, old.l1_pages, old.l2_pages = 4, 64, 8, 16
    old.struct_size, old.abi_version = ctypes.sizeof(OldConfig), 2
    h = ctypes.c_uint64()
    open_ = lib.cpcache_open
    assert open_(ctypes.cast(ctypes.byref(old), ctypes.POINTER(cpcache._Config)), ctypes.byref(h)) == -2  # CPCACHE_ERR_SIZE
    assert b"ABI-1" in lib.cpcache_last_error()
    old.abi_version = 1
    assert open_(ctypes.cast(ctypes.byref(old), ctypes.POINTER(cpcache._Config)), ctypes.byref(h)) == 0, lib.cpcache_last_error()
    try:
        out = ctypes.c_int64()
        assert lib.cpcache_kv_page_bytes(h.value, ctypes.byref(out)) == -1  # opaque pages: no layout
        info = cpcache._Info(struct_size=ctypes.sizeof(cpcache._Info))
        assert lib.cpcache_get_info(h.value, ctypes.byref(info)) == 0 and info.page_bytes == 64
    finally:
        assert lib.cpcache_close(h.value) == 0


# --- device buffers (CPCACHE_MEM_DEVICE) ---


class _CudaArray:
    """An object with only __cuda_array_interface__ (as CuPy's and Numba's arrays have): the
    binding takes it for device memory at `address`, which it never reads itself."""

    def __init__(self, address, shape, strides=None):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": tuple(shape), "typestr": "|u1",
                                         "strides": strides, "version": 3}


def _device_stand_ins(np):
    """Device stand-ins for every (layer, part) of SPEC: host arrays (kept alive by the dict)
    seen through __cuda_array_interface__, so their addresses are distinct and sized."""
    arrays = _token_slot_arrays(np)
    return arrays, [(l, j, _CudaArray(a.ctypes.data, a.shape)) for (l, j), a in arrays.items()]


def test_cuda_array_interface_is_a_device_buffer():
    """__cuda_array_interface__ (CuPy, Numba; a torch CUDA tensor through .is_cuda) makes a
    device buffer at its address, with its strides (None: C-contiguous); numpy stays host."""
    b = cpcache.token_slot_buffer(1, 0, _CudaArray(0x7F0000000000, (L1_PAGES * PAGE_TOKENS, 2, 8)), PAGE_TOKENS)
    assert (b.kind, b.base, b.bytes, b.page_stride, b.token_stride) == (cpcache.MEM_DEVICE, 0x7F0000000000, 512, 64, 16)
    padded = _CudaArray(0x7F0000010000, (L1_PAGES * PAGE_TOKENS, 2, 8), strides=(48, 8, 1))  # 48-byte rows
    b = cpcache.token_slot_buffer(0, 1, padded, PAGE_TOKENS)
    assert (b.kind, b.bytes, b.page_stride, b.token_stride) == (cpcache.MEM_DEVICE, 31 * 48 + 16, 4 * 48, 48)
    np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    assert cpcache.token_slot_buffer(0, 0, np.zeros((32, 2, 8), dtype=np.uint8), PAGE_TOKENS).kind == cpcache.MEM_HOST


def test_device_buffers_that_do_not_fit_name_the_buffer(tmp_path):
    """Mixed host and device buffers, device buffers with a host L1 kind, and device buffers
    over unpinned host slabs fail at open with InvalidError naming the buffer or the field,
    before any CUDA call; with every buffer device memory the binding asks for L1_DEVICE."""
    np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    arrays, dev = _device_stand_ins(np)
    mixed = [(l, j, a) for (l, j), a in arrays.items() if (l, j) != (1, 1)] + [dev[3]]
    with pytest.raises(cpcache.InvalidError, match=r"l1_buffers\[3\] \(layer 1, part 1\): cpcache.MEM_DEVICE, but "
                                                   r"l1_buffers\[0\] \(layer 0, part 0\) is cpcache.MEM_HOST"):
        one_rank(tmp_path, kv_layout=SPEC, l1_buffers=mixed, pin_host=True)
    host_pool = arrays[(0, 0)].ctypes.data
    with pytest.raises(cpcache.InvalidError, match=r"l1_buffers\[0\] \(layer 0, part 0\): device buffers "
                                                   r"\(cpcache.MEM_DEVICE\) need l1_kind cpcache.L1_DEVICE"):
        one_rank(tmp_path, kv_layout=SPEC, l1_buffers=dev, l1_kind=cpcache.L1_HOST, l1_base=host_pool)
    with pytest.raises(cpcache.InvalidError, match="a device L1 with host slabs needs pin_host=True"):
        one_rank(tmp_path, kv_layout=SPEC, l1_buffers=dev)  # L1_DEVICE taken: the next rule speaks


_DEVICE_RANK = """
import ctypes, os, sys
sys.path.insert(0, {python!r})
sys.path.insert(0, {tests!r})
import numpy as np
import cpcache
from test_kv_layout import SPEC, PAGE_TOKENS, L1_PAGES, _CudaArray

fake = os.environ.get("CPCACHE_TEST_FAKE_CUDA")
bufs, mem = [], {{}}
if fake:  # device memory from the fake driver's cuMemAlloc (host-addressable memfd mappings)
    cu = ctypes.CDLL(fake)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
for l in range(2):
    for j in range(2):
        n = L1_PAGES * PAGE_TOKENS * 16
        if fake:
            p = ctypes.c_ulonglong()
            assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
            addr = p.value
        else:  # no CUDA: host memory stands in, never copied
            mem[(l, j)] = a = np.zeros(n, dtype=np.uint8)
            addr = a.ctypes.data
        mem[(l, j, "addr")] = addr
        bufs.append((l, j, _CudaArray(addr, (L1_PAGES * PAGE_TOKENS, 2, 8))))
try:
    c = cpcache.Cache(world=1, rank=0, store="file://" + sys.argv[1], page_tokens=PAGE_TOKENS, l1_pages=L1_PAGES,
                      l2_pages=16, kv_layout=SPEC, l1_buffers=bufs, pin_host=True, l2_layout=sys.argv[2])
except cpcache.Error as e:
    print(type(e).__name__ + ": " + str(e), flush=True)
    sys.exit(0)
row = PAGE_TOKENS * 16  # a page slot's bytes in each buffer
def chunk(index, l, j):
    return bytes([(1 + index * 16 + l * 4 + j + k) % 251 for k in range(row)])
with c:
    tokens = list(range(100, 100 + 3 * PAGE_TOKENS))
    res = c.insert(tokens)
    for p in res.fill:
        for l in range(2):
            for j in range(2):
                ctypes.memmove(mem[(l, j, "addr")] + p.slot * row, chunk(p.index, l, j), row)
    while c.pending():
        c.step()
    for l in range(2):
        for j in range(2):
            ctypes.memset(mem[(l, j, "addr")], 0, L1_PAGES * row)
    assert c.evict_l1(3).freed == 3
    m = c.match(tokens)
    assert (m.device_pages, m.host_pages) == (0, 3), m
    assert c.load_back(m.node) == 3
    c.step()
    m = c.match(tokens)
    for l in range(2):
        if l == 0:
            c.wait_l1_layer_on(m.node, l, 0)  # the legacy default stream: the fake runs the wait at once
        else:
            c.wait_l1_layer(m.node, l)
        for i, slot in enumerate(m.l1_slots):
            for j in range(2):
                got = ctypes.string_at(mem[(l, j, "addr")] + slot * row, row)
                assert got == chunk(i, l, j), (i, l, j, slot)
    while c.pending():
        c.step()
print("checked", len(m.l1_slots), "pages layer by layer", flush=True)
"""


def _device_rank(tmp_path, env, l2_layout="page_first"):
    import subprocess
    script = tmp_path / "device_rank.py"
    script.write_text(_DEVICE_RANK.format(python=os.path.join(ROOT, "python"), tests=os.path.dirname(__file__)))
    store = tmp_path / "store"
    store.mkdir()
    out = subprocess.run([sys.executable, str(script), str(store), l2_layout], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, **env))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_device_buffers_without_cuda_fail_naming_them(tmp_path):
    """Device buffers on a machine whose CUDA driver does not load: ConfigError at open naming
    the buffers (the first one's layer and part) and the library."""
    pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    out = _device_rank(tmp_path, {"CPCACHE_CUDA_LIBRARY": str(tmp_path / "no-libcuda.so.1")})
    assert out.startswith("ConfigError: ") and "the 4 device L1 buffers (the first: layer 0 part 0)" in out, out
    assert "no-libcuda.so.1" in out, out


@pytest.mark.parametrize("l2_layout", ["page_first", "layer_first"])
def test_device_buffers_on_the_fake_driver(tmp_path, l2_layout):
    """__cuda_array_interface__ buffers in the fake libcuda's device memory (csrc/cuda_fake.c,
    built with gcc): the CUDA engine backs the pages up, and after an eviction (the buffers
    cleared) loads them back; each layer holds its bytes once wait_l1_layer_on (layer 0) or
    wait_l1_layer (layer 1) returns."""
    import shutil
    import subprocess
    pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    src = os.path.join(ROOT, "csrc", "cuda_fake.c")
    if not os.path.exists(src) or shutil.which("gcc") is None:
        pytest.skip("the fake libcuda needs csrc/cuda_fake.c and gcc (an installed package has neither)")
    lib = tmp_path / "libcuda_fake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), src], check=True)
    out = _device_rank(tmp_path, {"CPCACHE_CUDA_LIBRARY": str(lib), "CPCACHE_TEST_FAKE_CUDA": str(lib)}, l2_layout)
    assert "checked 3 pages layer by layer" in out, out


def test_torch_cuda_buffers_load_back_layer_by_layer(tmp_path):
    """A real GPU: torch CUDA tensors as the engine's per-layer L1 (device buffers); the pages
    come back from L2 layer by layer, each layer checked once the current stream waited for it."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 — any import failure means no torch here
        pytest.skip(f"torch does not import: {e}")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    tensors = {(l, j): torch.zeros((L1_PAGES * PAGE_TOKENS, 2, 8), dtype=torch.uint8, device="cuda")
               for l in range(2) for j in range(2)}
    bufs = [(l, j, t) for (l, j), t in tensors.items()]
    with one_rank(tmp_path, kv_layout=SPEC, l1_buffers=bufs, pin_host=True, device=torch.cuda.current_device()) as c:
        tokens = list(range(100, 100 + 2 * PAGE_TOKENS))
        res = c.insert(tokens)
        want = {}
        for p in res.fill:
            for (l, j), t in tensors.items():
                want[(p.index, l, j)] = 1 + p.index * 16 + l * 4 + j
                t[p.slot * PAGE_TOKENS:(p.slot + 1) * PAGE_TOKENS] = want[(p.index, l, j)]
        torch.cuda.synchronize()
        while c.pending():
            c.step()
        for t in tensors.values():
            t.zero_()
        torch.cuda.synchronize()
        assert c.evict_l1(2).freed == 2
        m = c.match(tokens)
        assert c.load_back(m.node) == 2
        c.step()
        m = c.match(tokens)
        stream = torch.cuda.current_stream()
        for layer in range(2):
            c.wait_l1_layer_on(m.node, layer, stream)
            for i, slot in enumerate(m.l1_slots):
                for j in range(2):
                    got = tensors[(layer, j)][slot * PAGE_TOKENS:(slot + 1) * PAGE_TOKENS]
                    assert bool((got == want[(i, layer, j)]).all()), (i, layer, j)
        while c.pending():
            c.step()


_BAD_BUFFERS_RANK = """
import os, sys
sys.path.insert(0, {python!r})
import numpy as np
import cpcache
# Attention-TP 2 (the world of 2): 8 bytes of each part a token on each rank, 128 a page.
arrays = {{(l, j): np.zeros(({l1} * {pt}, 1, 8), dtype=np.uint8) for l in range(2) for j in range(2)}}
arrays[(1, 1)] = arrays[(1, 1)][:-{pt}]  # a slot short
kw = dict(page_tokens={pt}, l1_pages={l1}, l2_pages=16, page_bytes=128, kv_layout={spec!r}, timeout_ms=20000,
          l1_buffers=[(l, j, a) for (l, j), a in arrays.items()])
rank = int(os.environ["RANK"])
for world in ("explicit", "launcher"):
    extra = dict(world=2, rank=rank) if world == "explicit" else {{}}
    try:
        cpcache.Cache(**kw, **extra).close()
        print(world, "opened")
    except cpcache.Error as e:
        print(world, type(e).__name__, e)
"""


def test_bad_buffers_under_a_launchers_world_are_invalid_as_under_an_explicit_one(tmp_path):
    """A buffer a slot short on 2 ranks under cpcache launch is InvalidError naming the layer
    and part, with the same message whether the world is explicit (world=2, rank=RANK) or the
    launcher's (world 0, rank -1), on both ranks, before any rank talks to another (it used
    to be checked after the rendezvous: IOError_ on one rank, PeerLostError on the other)."""
    import shutil
    import subprocess
    pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
    binary = os.environ.get("CPCACHE_BIN") or os.path.join(ROOT, "bin", "cpcache")
    if not os.access(binary, os.X_OK):
        binary = shutil.which("cpcache") or binary
    script = tmp_path / "rank.py"
    script.write_text(_BAD_BUFFERS_RANK.format(python=os.path.join(ROOT, "python"), pt=PAGE_TOKENS, l1=L1_PAGES, spec=SPEC))
    out = subprocess.run([binary, "launch", "-n", "2", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    lines = sorted(line for line in out.stdout.splitlines() if line[:1] == "[")
    assert len(lines) == 4, out.stdout + out.stderr
    for rank in (0, 1):
        mine = {line.split()[1]: line.split(None, 2)[2] for line in lines if line.startswith(f"[{rank}] ")}
        assert mine["explicit"].startswith("InvalidError ") and 'layer 1 part 1 ("v")' in mine["explicit"], mine
        assert mine["launcher"] == mine["explicit"], mine
