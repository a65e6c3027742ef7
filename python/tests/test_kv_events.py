"""KV events on the wire: a separate process subscribes to `cpcache run --kv-events` as a
vLLM KV-aware router would (ZMQ SUB + the replay ROUTER, msgpack payloads decoded by the
layout of vLLM's KVEventBatch, BlockStored, BlockRemoved and AllBlocksCleared), rebuilds each
replica's pages per tier from the events through evictions, a flush and a recovery, and
compares them with the pages the cache itself holds right after the flush and at the end.

Needs Debian's python3-zmq and python3-msgpack (make deps) and bin/cpcache (or CPCACHE_BIN).
"""

import json
import os
import socket
import subprocess
import time

import msgpack
import pytest
import zmq

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPCACHE_BIN = os.environ.get("CPCACHE_BIN", os.path.join(ROOT, "bin", "cpcache"))
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM = {"GPU": "device", "CPU": "host", "STORAGE": "storage"}


def free_port_pairs(n):
    """n ports p, each with p + 1 free too (replica d uses the port plus d), no two pairs
    overlapping: the kernel hands out ephemeral ports in sequence, so two free ports are
    often neighbours and one's "plus 1" is the other."""
    held, bases = [], []
    try:
        while len(bases) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            base = s.getsockname()[1]
            nxt = socket.socket()
            try:
                nxt.bind(("127.0.0.1", base + 1))
            except OSError:
                nxt.close()
                continue
            held.append(nxt)
            bases.append(base)
    finally:
        for s in held:
            s.close()
    return bases


class Replica:
    """What a router knows of one replica: its pages per tier, from decoded batches."""

    def __init__(self, block_size=16):
        self.block_size = block_size  # tokens per page of the publishing cache
        self.tiers = {"device": set(), "host": set(), "storage": set()}
        self.next_seq = 0
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}

    def apply(self, seq, payload):
        assert seq == self.next_seq, f"batch {seq} applied, {self.next_seq} expected"
        self.next_seq += 1
        ts, events, dp = msgpack.unpackb(payload, raw=False)  # KVEventBatch, array-like
        assert isinstance(ts, float) and ts > 1.6e9
        for ev in events:
            kind = ev[0]
            self.counts[kind] += 1
            if kind == "BlockStored":
                hashes, parent, token_ids, block_size, lora_id, medium = ev[1:7]
                assert lora_id is None and block_size == self.block_size and len(token_ids) == block_size * len(hashes)
                # Page ids: 32-byte SHA-256 chained hashes (msgpack bin), as vLLM's own.
                assert parent is None or (isinstance(parent, bytes) and len(parent) == 32)
                assert all(isinstance(h, bytes) and len(h) == 32 for h in hashes)
                self.tiers[MEDIUM[medium]].update(h.hex() for h in hashes)  # the dump's form
            elif kind == "BlockRemoved":
                hashes, medium = [h.hex() for h in ev[1]], ev[2]
                tier = self.tiers[MEDIUM[medium]]
                missing = [h for h in hashes if h not in tier]
                assert not missing, f"batch {seq} removes {medium} pages never stored: {missing[:3]}"
                tier.difference_update(hashes)
            elif kind == "AllBlocksCleared":
                for t in self.tiers.values():
                    t.clear()
            else:
                raise AssertionError(f"unknown event {ev!r}")
        return dp


def replay(ctx, endpoint, start):
    """Asks the replay socket for every batch from start on: [(seq, payload)]."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)
    while True:
        assert poller.poll(10000), "the replay socket did not answer in 10 s"
        frames = dealer.recv_multipart()
        _, seq, payload = frames
        if seq == END_SEQ:
            break
        out.append((int.from_bytes(seq, "big"), payload))
    dealer.close()
    return out


def test_router_rebuilds_each_replica_from_events(tmp_path):
    pub_port, replay_port = free_port_pairs(2)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    # The publishers connect to the router (their endpoint names a host); replica d uses
    # the port plus d.
    sub.bind(f"tcp://127.0.0.1:{pub_port}")
    sub.bind(f"tcp://127.0.0.1:{pub_port + 1}")
    dump = tmp_path / "dump"
    dump.mkdir()
    env = dict(os.environ, CPCACHE_KV_EVENTS_DUMP=str(dump))
    args = [CPCACHE_BIN, "run", "--world", "8", "--dp", "2", "--attn-cp", "4", "--page-size", "16",
            "--clients", "12", "--rounds", "4", "--l1-pages", "64", "--l2-pages", "96", "--kv-bytes-per-token", "64",
            "--storage", f"file://{tmp_path / 'l3'}",
            # One flush per replica (when=idle: admissions held from step 40 until nothing runs
            # and nothing is in flight, so it is made, not refused as busy) and one recovery.
            "--fault", "flush:step=40,when=idle;diverge-tree:rank=1,step=90;diverge-tree:rank=5,step=120",
            "--kv-events", f"tcp://127.0.0.1:{pub_port}", "--kv-events-replay", f"tcp://127.0.0.1:{replay_port}",
            "--json", str(tmp_path / "report.json")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    live = {}  # replica -> {seq: payload}
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    replayed = {}
    deadline = time.time() + 240
    while time.time() < deadline:
        if poller.poll(100):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b""
            dp = msgpack.unpackb(payload, raw=False)[2]
            live.setdefault(dp, {})[int.from_bytes(seq, "big")] = payload
            # A router that joined late (the first batches went out before its subscription
            # arrived) asks the replay socket for what it missed, once per replica.
            if dp not in replayed and min(live[dp]) > 0:
                replayed[dp] = replay(ctx, f"tcp://127.0.0.1:{replay_port + dp}", 0)
            continue
        if proc.poll() is not None:
            break
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    # Whatever the SUB socket still holds.
    while poller.poll(200):
        topic, seq, payload = sub.recv_multipart()
        dp = msgpack.unpackb(payload, raw=False)[2]
        live.setdefault(dp, {})[int.from_bytes(seq, "big")] = payload
    sub.close()
    ctx.term()
    assert sorted(live) == [0, 1], sorted(live)
    report = json.loads((tmp_path / "report.json").read_text())
    for dp in (0, 1):
        batches = dict(live[dp])
        for seq, payload in replayed.get(dp, []):
            if seq in batches:
                assert batches[seq] == payload, f"replica {dp}: replayed batch {seq} differs from the live one"
            batches[seq] = payload
        seqs = sorted(batches)
        assert seqs == list(range(len(seqs))), f"replica {dp}: batches {seqs[:5]}...{seqs[-5:]} have gaps"
        # Right after the flush: the batches before the first one that followed it rebuild
        # what the cache held then (the flush emptied device and host).
        flushed = json.loads((dump / f"replica-{dp}-flush-1.json").read_text())
        r = Replica()
        last = flushed["next_seq"] - 1  # the flush's batch: it clears every tier
        for seq in seqs[:last]:
            assert r.apply(seq, batches[seq]) == dp
        cleared = r.counts["AllBlocksCleared"]
        assert r.apply(last, batches[last]) == dp
        assert r.counts["AllBlocksCleared"] == cleared + 1, (dp, last, r.counts)
        for tier in ("device", "host", "storage"):
            want = set(flushed[tier] or [])
            assert r.tiers[tier] == want, (dp, "after the flush", tier, len(r.tiers[tier]), len(want))
        assert not r.tiers["device"] and not r.tiers["host"], (dp, {k: len(v) for k, v in r.tiers.items()})
        r = Replica()
        for seq in seqs:
            assert r.apply(seq, batches[seq]) == dp
        held = json.loads((dump / f"replica-{dp}.json").read_text())
        for tier in ("device", "host", "storage"):
            want = set(held[tier] or [])
            assert r.tiers[tier] == want, (dp, tier, len(r.tiers[tier]), len(want))
        # The run went through evictions, the flush and a recovery (whose clear is followed by the
        # storage pages announced again).
        assert r.counts["BlockRemoved"] > 0 and r.counts["AllBlocksCleared"] >= 2, (dp, r.counts)
        assert len(r.tiers["storage"]) > 0 and len(r.tiers["host"]) > 0, (dp, {k: len(v) for k, v in r.tiers.items()})
    assert report["recoveries"] == 2, report["recoveries"]
    assert (report["flushes"], report["flushes_refused"]) == (2, 0), (report["flushes"], report["flushes_refused"])
