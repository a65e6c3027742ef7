"""KV events and metrics from a linked engine: two ranks of one replica (attention CP 2,
started by `cpcache launch` as an engine's launcher would) open cpcache.Cache with
kv_events=, kv_events_replay=, kv_events_topic= and metrics_addr=, and drive the cache through
L1 evictions, load-backs, storage backups and a flush. A subscriber in this process (another
process than the ranks: python3-zmq, msgpack) rebuilds the replica's pages per tier from the
BlockStored / BlockRemoved / AllBlocksCleared batches (live and replayed), with the checker of
`cpcache run --kv-events`'s test (test_kv_events.Replica), and compares them with the pages
the cache holds when the publisher closes (the dump of CPCACHE_KV_EVENTS_DUMP). Each rank's
metrics_text() has the cpcache_* series with the values of its stats(), and metrics_addr
serves them on /metrics.

Needs Debian's python3-zmq and python3-msgpack (make deps), libcpcache (CPCACHE_LIBRARY) and
bin/cpcache (or CPCACHE_BIN) for the launcher.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

msgpack = pytest.importorskip("msgpack", reason="msgpack (Debian python3-msgpack) is not installed")
zmq = pytest.importorskip("zmq", reason="pyzmq (Debian python3-zmq) is not installed")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpcache  # noqa: E402
from test_kv_events import Replica, free_port_pairs, replay  # noqa: E402  (the runner's checker)

CPCACHE_BIN = os.environ.get("CPCACHE_BIN", os.path.join(ROOT, "bin", "cpcache"))
TOPIC = "kv-linked"

# One rank of the job: conversations of 6 clients over 3 rounds (each round's prompt extends
# the last), 8 L1 pages per rank (evictions), L2 and file:// storage below, a flush after the
# first round; then, once nothing is pending, its stats() and metrics_text() go to
# rank-<r>.json, done-<r> tells the test, and it closes once the test wrote "release".
WORKER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import cpcache
out, kv, replay_ep, metrics_port = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
rank = int(os.environ["RANK"])
c = cpcache.Cache(attn_cp=2, page_tokens=16, page_bytes=64, l1_pages=8, l2_pages=24,
                  storage_url="file://" + os.path.join(out, "l3"), model="kv-linked",
                  kv_events=kv, kv_events_replay=replay_ep, kv_events_topic="kv-linked",
                  metrics_addr="127.0.0.1:%d" % (metrics_port + rank))

def drain():
    for _ in range(1000):
        if not c.pending():
            return
        c.step()
    raise SystemExit("still pending after 1000 steps")

loads = 0
for rnd in range(3):
    for client in range(6):
        toks = [(client * 7919 + t * 17) % 32000 for t in range((rnd + 1) * 3 * 16)]
        m = c.match(toks)
        if m.host_pages:
            c.lock(m.node)
            loads += c.load_back(m.node)
            for _ in range(1000):
                c.step()
                if not c.load_pending(m.node):
                    break
            c.unlock(m.node)
        drain()  # backups done: their L1 slots can be freed for the insert
        c.insert(toks)
        c.step()
    drain()
    if rnd == 0:
        c.flush()
drain()
with open(os.path.join(out, "rank-%d.json" % rank), "w") as f:
    json.dump({"stats": c.stats(), "metrics": c.metrics_text(), "loads": loads}, f)
open(os.path.join(out, "done-%d" % rank), "w").close()
deadline = time.time() + 120
while not os.path.exists(os.path.join(out, "release")):
    if time.time() > deadline:
        raise SystemExit("the test never released the ranks")
    time.sleep(0.05)
c.close()
"""


def series(text, name, rank):
    """The value of the series name{..., rank="rank", ...} (or name without labels) in a text
    exposition."""
    for line in text.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name and (m.group(2) is None or f'rank="{rank}"' in m.group(2)):
            return float(m.group(3))
    raise AssertionError(f"no series {name} for rank {rank} in:\n{text[:2000]}")


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_linked_engine_publishes_what_it_holds(tmp_path, transport):
    kv_port, replay_port, metrics_port = free_port_pairs(3)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.setsockopt(zmq.LINGER, 0)
    if transport == "tcp":
        # The publisher connects to the router, which binds (the endpoint names a host).
        kv, replay_ep = f"tcp://127.0.0.1:{kv_port}", f"tcp://127.0.0.1:{replay_port}"
        sub.bind(kv)
    else:
        # The publisher binds ipc:// endpoints; the router connects (and retries until bound).
        kv, replay_ep = f"ipc://{tmp_path}/kv", f"ipc://{tmp_path}/replay"
        sub.connect(kv)
    dump = tmp_path / "dump"
    dump.mkdir()
    env = dict(os.environ, CPCACHE_KV_EVENTS_DUMP=str(dump))
    cmd = [CPCACHE_BIN, "launch", "-n", "2", "--", sys.executable, "-c", WORKER,
           os.path.join(ROOT, "python"), str(tmp_path), kv, replay_ep, str(metrics_port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    live, replayed, scraped = {}, None, {}
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            if poller.poll(100):
                topic, seq, payload = sub.recv_multipart()
                assert topic == TOPIC.encode()
                live[int.from_bytes(seq, "big")] = payload
                continue
            if replayed is None and all((tmp_path / f"done-{r}").exists() for r in (0, 1)):
                # Every rank is idle: the replay socket answers every batch from 0 on (the
                # subscription may have missed the first ones), and /metrics is served.
                replayed = replay(ctx, replay_ep, 0)
                for r in (0, 1):
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port + r}/metrics", timeout=10) as resp:
                        scraped[r] = resp.read().decode()
                (tmp_path / "release").touch()
            if proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    while poller.poll(200):
        topic, seq, payload = sub.recv_multipart()
        live[int.from_bytes(seq, "big")] = payload
    sub.close()
    ctx.term()
    assert replayed is not None, out

    # The events: every batch from 0 to the dump's next_seq, live and replayed alike.
    held = json.loads((dump / "replica-0.json").read_text())
    batches = dict(live)
    for seq, payload in replayed:
        if seq in batches:
            assert batches[seq] == payload, f"replayed batch {seq} differs from the live one"
        batches[seq] = payload
    assert sorted(batches) == list(range(held["next_seq"])), (sorted(batches)[:5], held["next_seq"])
    r = Replica()
    for seq in range(held["next_seq"]):
        assert r.apply(seq, batches[seq]) == 0
    for tier in ("device", "host", "storage"):
        want = set(held[tier] or [])
        assert r.tiers[tier] == want, (tier, len(r.tiers[tier]), len(want))
    assert r.counts["BlockRemoved"] > 0 and r.counts["AllBlocksCleared"] >= 1, r.counts
    assert r.tiers["device"] and r.tiers["host"] and r.tiers["storage"], {k: len(v) for k, v in r.tiers.items()}

    # The metrics: this rank's stats() in metrics_text(), and the same served on /metrics.
    ranks = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert sum(x["loads"] for x in ranks) > 0, "no page was loaded back"
    for i, x in enumerate(ranks):
        st, text = x["stats"], x["metrics"]
        for name, field in (("cpcache_steps_total", "steps"), ("cpcache_collectives_total", "collectives"),
                            ("cpcache_matches_total", "matches"), ("cpcache_inserted_pages_total", "inserted_pages"),
                            ("cpcache_l1_used_pages", "l1_used"), ("cpcache_tree_nodes", "nodes")):
            assert series(text, name, i) == st[field], (i, name, field, st[field])
            assert series(scraped[i], name, i) == st[field], (i, "served", name)
        assert st["steps"] > 0 and st["inserted_pages"] > 0, st
        assert "go_goroutines" in scraped[i] and "go_goroutines" not in text
        # The replica's publishing rank (its first) exports the publisher's counters.
        published = series(text, "cpcache_run_kv_event_batches_total", i) if i == 0 else None
        assert (i == 0) == ("cpcache_run_kv_event_batches_total" in text), i
        assert published is None or published >= 0


def test_bad_endpoints_are_named_before_any_rank_starts(tmp_path):
    """A bad endpoint or address: InvalidError naming the keyword and the value, without
    waiting for a peer (world 2, rank 0 alone)."""
    base = dict(world=2, rank=0, attn_cp=2, store=f"file://{tmp_path}", page_bytes=64, l1_pages=4, l2_pages=8,
                timeout_ms=600000)
    for kw, want in ((dict(kv_events="tcp://*:99999"), 'kv_events "tcp://*:99999"'),
                     (dict(kv_events="bogus://x"), 'kv_events "bogus://x"'),
                     (dict(kv_events="tcp://host:5557", kv_events_replay="tcp://host:5558"),
                      'kv_events_replay "tcp://host:5558"'),
                     (dict(kv_events_replay="tcp://*:5558"), 'kv_events_replay "tcp://*:5558"'),
                     (dict(metrics_addr="nowhere"), 'metrics_addr "nowhere"')):
        start = time.time()
        with pytest.raises(cpcache.InvalidError) as e:
            cpcache.Cache(**base, **kw)
        assert want in str(e.value), str(e.value)
        assert time.time() - start < 30, "the open waited for its peer"


def test_metrics_text_of_one_rank(tmp_path):
    """metrics_text() on a rank without events: the cache's series with stats()'s values."""
    with cpcache.Cache(world=1, rank=0, store=f"file://{tmp_path}", page_bytes=64, l1_pages=4, l2_pages=8) as c:
        c.insert(list(range(64)))
        c.step()
        st, text = c.stats(), c.metrics_text()
        assert series(text, "cpcache_inserted_pages_total", 0) == st["inserted_pages"] == 4
        assert series(text, "cpcache_steps_total", 0) == st["steps"] >= 1
        assert "cpcache_run_kv_event" not in text


def test_missing_libzmq_is_a_config_error(tmp_path):
    """kv_events on a machine without libzmq: ConfigError naming the library and Debian's
    package (in a fresh process: the library is loaded once per process)."""
    import subprocess
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import cpcache\n"
              "try:\n"
              "    cpcache.Cache(world=1, rank=0, store=sys.argv[2], page_bytes=64, l1_pages=4, l2_pages=8,\n"
              "                  kv_events='ipc://' + sys.argv[3])\n"
              "except cpcache.Error as e:\n"
              "    print(type(e).__name__, e)\n")
    env = dict(os.environ, CPCACHE_ZMQ_LIBRARY="/nonexistent/libzmq.so.5")
    out = subprocess.run([sys.executable, "-c", script, os.path.join(ROOT, "python"), f"file://{tmp_path}",
                          str(tmp_path / "kv")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ConfigError "), out.stdout + out.stderr
    assert "libzmq.so.5" in out.stdout and "libzmq5" in out.stdout, out.stdout
