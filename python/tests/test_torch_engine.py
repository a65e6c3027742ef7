"""The torch engine (python/examples/torch_engine.py): the reference transformer in torch worker
processes (spawn) over CP ranks, attention merged over torch.distributed (gloo), K/V tensors
lent to the cache, driven by an SGLang-style scheduler. Every output must equal the same
request computed without the cache, with hits in L1, L2 and (from a filled file:// store)
storage; a deliberately broken engine (a skipped layer wait, a page in its neighbour's slot)
must show as differing outputs and exit 1."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")
try:
    import torch.distributed as _dist
    _TORCH = None if _dist.is_available() and _dist.is_gloo_available() else "torch.distributed has no gloo backend"
except Exception as e:  # noqa: BLE001 — any import failure means no torch here
    _TORCH = f"torch does not import (Debian python3-torch): {e}"

pytestmark = pytest.mark.skipif(_TORCH is not None, reason=_TORCH or "")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENGINE = os.path.join(ROOT, "python", "examples", "torch_engine.py")
REQUESTS = 12


def run_engine(*args, timeout=240):
    """Runs the engine; (exit status, {checked, differing, l1, l2, storage}, output)."""
    p = subprocess.run([sys.executable, ENGINE, "--requests", str(REQUESTS), "--timeout", "60", *args],
                       capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    got = {}
    m = re.search(r"^outputs checked (\d+), differing (\d+)$", p.stdout, re.M)
    if m:
        got.update(checked=int(m[1]), differing=int(m[2]))
    m = re.search(r"^hits: L1 (\d+) L2 (\d+) storage (\d+) tokens$", p.stdout, re.M)
    if m:
        got.update(l1=int(m[1]), l2=int(m[2]), storage=int(m[3]))
    return p.returncode, got, out


@pytest.mark.parametrize("world,cp", [(1, 1), (2, 2), (4, 4)])
def test_outputs_equal_cache_off_at_every_cp_size(world, cp):
    rc, got, out = run_engine("--world", str(world), "--attn-cp", str(cp))
    assert rc == 0, out
    assert got["checked"] == REQUESTS and got["differing"] == 0, out
    assert got["l1"] > 0 and got["l2"] > 0, out  # prefixes served from L1 and loaded back from L2


def test_two_replicas_of_cp_2():
    """world 4 over CP groups of 2: two DP replicas, each serving its own conversations."""
    rc, got, out = run_engine("--world", "4", "--attn-cp", "2")
    assert rc == 0, out
    assert got["checked"] == REQUESTS and got["differing"] == 0, out
    assert got["l1"] > 0, out


def test_a_filled_store_serves_a_fresh_engine(tmp_path):
    url = f"file://{tmp_path}/l3"
    rc, got, out = run_engine("--world", "2", "--storage", url)
    assert rc == 0 and got["differing"] == 0 and got["storage"] == 0, out
    assert os.listdir(tmp_path / "l3"), "the first run stored nothing"
    rc, got, out = run_engine("--world", "2", "--storage", url)
    assert rc == 0, out
    assert got["checked"] == REQUESTS and got["differing"] == 0, out
    assert got["storage"] > 0, out


@pytest.mark.parametrize("broken", ["skip-layer-wait", "neighbour-slot"])
def test_a_broken_engine_differs(broken):
    """The check is not vacuous: reading loaded layers without waiting for them, or recording
    a page in its neighbour's slot, changes outputs and fails the run."""
    rc, got, out = run_engine("--world", "2", "--break", broken)
    assert got.get("differing", 0) > 0, out
    assert rc == 1, out


def test_kv_events_option():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import cpcache
    import inspect
    if "kv_events" in inspect.signature(cpcache.Cache.__init__).parameters:
        # TODO(issue 39, helper E's kv_events=): a subscriber in another process rebuilding
        # the replica's pages from the engine's events.
        pytest.skip("kv_events= exists: the subscriber check comes with it")
    p = subprocess.run([sys.executable, ENGINE, "--kv-events", "tcp://127.0.0.1:1"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "not supported by this binding yet" in p.stderr, p.stdout + p.stderr
