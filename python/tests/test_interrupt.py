"""Issue 38, point 4: Ctrl-C in a Python caller raises KeyboardInterrupt promptly even while
a collective waits for a late peer, and the peers then see this rank leave.

Two ranks as real processes (world 2, shared-memory consensus on this host, timeout_ms
20000). Rank 0 steps while rank 1 is late (it waits for a go-file, at most 30 s); SIGINT to
rank 0 inside step() must raise KeyboardInterrupt well under a second (the issue's target is
0.2 s; before, the step waited for its 20 s deadline). Rank 1 then steps and must see a lost
peer at once, not at its deadline: at its first step with shared-memory consensus, which
cancels the waiting collective; with Gloo, whose collective cannot be cancelled once inside
Gloo, the round rank 0 had entered completes when rank 1 arrives (rank 0 closes right after)
and rank 1's next step sees the lost peer."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

RANK = r"""
import os, signal, sys, time
sys.path.insert(0, {python!r})
import cpcache
rank, store, go = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = cpcache.Cache(world=2, rank=rank, store=store, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16,
                  timeout_ms=20000, consensus=sys.argv[4])
print("opened", os.getpid(), flush=True)
if rank == 0:
    got = []
    def on_int(sig, frame):
        got.append(time.monotonic())
        signal.default_int_handler(sig, frame)
    signal.signal(signal.SIGINT, on_int)
    print("stepping", flush=True)
    try:
        c.step()
        print("stepped without the peer", flush=True)
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt after {{time.monotonic() - got[0]:.3f}} s", flush=True)
    try:
        c.step()
    except cpcache.Error as e:
        print("after the interrupt:", type(e).__name__, flush=True)
    c.close()
else:
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    t = time.monotonic()
    try:
        for i in range(3):
            c.step()
        print("stepped", flush=True)
    except cpcache.Error as e:
        print(f"{{type(e).__name__}} after {{time.monotonic() - t:.3f}} s at step {{i}}: {{e}}", flush=True)
    c.close()
"""


@pytest.mark.parametrize("consensus", ["shm", "gloo"])
def test_ctrl_c_inside_a_step_waiting_for_a_late_peer(tmp_path, consensus):
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(python=os.path.join(ROOT, "python")))
    store, go = f"file://{tmp_path}/store", str(tmp_path / "go")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), store, go, consensus], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        r0, r1 = procs
        line = r0.stdout.readline()
        assert line.startswith("opened"), line + r0.stderr.read()
        assert r0.stdout.readline().strip() == "stepping"
        time.sleep(1.0)  # rank 0 is inside step(), waiting for rank 1
        sent = time.monotonic()
        r0.send_signal(signal.SIGINT)
        line = r0.stdout.readline()
        returned = time.monotonic() - sent
        print(f"rank 0: {line.strip()} (the test saw it {returned:.3f} s after sending SIGINT)")
        assert line.startswith("KeyboardInterrupt after"), line + r0.stderr.read()
        # The handler runs only once Python gets control back: both the rank's measure (from
        # the handler to the except block) and ours (from the signal to the line) must be short.
        took = float(line.split()[2])
        assert took < 1.0 and returned < 2.0, (line, returned)  # before: 19 s, the step's 20 s deadline
        line = r0.stdout.readline()
        assert line.strip() == "after the interrupt: ClosedError", line  # the cache was aborted
        open(go, "w").close()
        t = time.monotonic()
        out1, err1 = r1.communicate(timeout=60)
        print(f"rank 1: {out1.strip()!r} ({time.monotonic() - t:.3f} s after it was let go)")
        assert "PeerLostError after" in out1, out1 + err1
        assert float(out1.split("PeerLostError after ")[1].split()[0]) < 5.0, out1  # not its 20 s deadline
        assert ("at step 0" if consensus == "shm" else "at step 1") in out1, out1
        out0, err0 = r0.communicate(timeout=60)
        assert r0.returncode == 0, out0 + err0
    finally:
        for p in procs:
            p.kill()


OPEN_ALONE = r"""
import os, signal, sys, time
sys.path.insert(0, {python!r})
import cpcache
store = sys.argv[1]
got = []
def on_int(sig, frame):
    got.append(time.monotonic())
    signal.default_int_handler(sig, frame)
signal.signal(signal.SIGINT, on_int)
print("opening", flush=True)
try:
    cpcache.Cache(world=2, rank=0, store=store, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16, timeout_ms=20000)
    print("opened without the peer", flush=True)
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {{time.monotonic() - got[0]:.3f}} s", flush=True)
# Nothing of the aborted open is left: a cache of one rank opens in this process.
with cpcache.Cache(world=1, rank=0, store=store + "-2", page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16) as c:
    c.step()
print("reopened", flush=True)
"""


def test_ctrl_c_inside_open_waiting_for_a_missing_rank(tmp_path):
    """Rank 0 of 2 opens alone (rank 1 never comes, timeout_ms 20000): SIGINT raises
    KeyboardInterrupt promptly (before: at the 20 s deadline, as a TimeoutError_), and the
    process can open a cache afterwards."""
    script = tmp_path / "open.py"
    script.write_text(OPEN_ALONE.format(python=os.path.join(ROOT, "python")))
    p = subprocess.Popen([sys.executable, str(script), f"file://{tmp_path}/store"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "opening"
        time.sleep(1.0)  # inside the rendezvous
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline()
        returned = time.monotonic() - sent
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    print(f"{line.strip()} (the test saw it {returned:.3f} s after sending SIGINT)")
    assert line.startswith("KeyboardInterrupt after"), line + out + err
    assert float(line.split()[2]) < 1.0 and returned < 2.0, (line, returned)  # before: the 20 s deadline
    assert "reopened" in out and p.returncode == 0, out + err
