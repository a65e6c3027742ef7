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


def test_kv_events_rebuild_the_replica(tmp_path):
    """--kv-events: a router in another process (this one) subscribes to the engine's KV events
    (vLLM's msgpack batches, tcp: the router binds, the publisher connects), asks the replay
    socket for any batch its subscription missed, and rebuilds the replica's pages per tier
    with `cpcache run --kv-events`'s checker: they must be the pages the cache holds when its
    publisher closes (the library's CPCACHE_KV_EVENTS_DUMP), at every sequence number."""
    import json
    import time
    msgpack = pytest.importorskip("msgpack", reason="msgpack (Debian python3-msgpack) is not installed")
    zmq = pytest.importorskip("zmq", reason="pyzmq (Debian python3-zmq) is not installed")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_kv_events import Replica, free_port_pairs, replay  # noqa: E402  (the runner's checker)
    del msgpack
    kv_port, replay_port = free_port_pairs(2)
    kv, replay_ep = f"tcp://127.0.0.1:{kv_port}", f"tcp://127.0.0.1:{replay_port}"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.bind(kv)
    dump = tmp_path / "dump"
    dump.mkdir()
    env = dict(os.environ, CPCACHE_KV_EVENTS_DUMP=str(dump))
    cmd = [sys.executable, ENGINE, "--requests", str(REQUESTS), "--timeout", "60", "--world", "2",
           "--storage", f"file://{tmp_path}/l3", "--kv-events", kv, "--kv-events-replay", replay_ep]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    batches, replayed = {}, False
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if not poller.poll(100):
                continue
            frames = sub.recv_multipart()
            seq, payload = int.from_bytes(frames[-2], "big"), frames[-1]
            batches[seq] = payload
            if not replayed and seq > 0 and 0 not in batches:
                # The subscription missed the first batches: the replay socket has them
                # while the engine runs.
                for rseq, rpayload in replay(ctx, replay_ep, 0):
                    batches.setdefault(rseq, rpayload)
                replayed = True
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while poller.poll(200):
        frames = sub.recv_multipart()
        batches[int.from_bytes(frames[-2], "big")] = frames[-1]
    sub.close()
    ctx.term()
    assert proc.returncode == 0, out
    assert re.search(r"^outputs checked 12, differing 0$", out, re.M), out
    held = json.loads((dump / "replica-0.json").read_text())
    assert sorted(batches) == list(range(held["next_seq"])), (sorted(batches)[:5], held["next_seq"])
    r = Replica(block_size=4)  # the engine's pages are 4 tokens
    for seq in range(held["next_seq"]):
        r.apply(seq, batches[seq])
    for tier in ("device", "host", "storage"):
        assert r.tiers[tier] == set(held[tier] or []), (tier, len(r.tiers[tier]), len(held[tier] or []))
    # The engine stored pages in every tier, evicted some, and its final reset() cleared L1
    # and L2 (storage keeps what was backed up).
    assert r.counts["BlockStored"] > 0 and r.counts["BlockRemoved"] > 0, r.counts
    assert r.counts["AllBlocksCleared"] >= 1 and r.tiers["storage"], r.counts
