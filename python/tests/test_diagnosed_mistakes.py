"""Mistakes a scheduler makes with step(), diagnosed over the C ABI on 2 ranks under
`cpcache launch` (issue 38): I/O left pending with no step() is warned about once, naming
step(), and counted; a rank that calls step() once more than its peer gets an error naming
both counts, well before timeout_ms.

Needs libcpcache.so (make capi, or CPCACHE_LIBRARY) and the cpcache binary (CPCACHE_BIN).
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from test_cpcache import CPCACHE_BIN  # noqa: E402

PRELUDE = f"""
import os, sys, time
sys.path.insert(0, {os.path.join(ROOT, "python")!r})
import cpcache
rank = int(os.environ["RANK"])
c = cpcache.Cache(l1_pages=8, l2_pages=32, page_bytes=64, page_tokens=4, timeout_ms=20000)
"""


def launch(tmp_path, body, env=None, timeout=60):
    script = tmp_path / "rank.py"
    script.write_text(PRELUDE + body)
    store = tmp_path / "store"
    store.mkdir()
    out = subprocess.run([CPCACHE_BIN, "launch", "-n", "2", "--store", f"file://{store}", "--",
                          sys.executable, str(script)],
                         capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, **(env or {})))
    return out


def test_forgotten_step_warns_once_and_counts(tmp_path):
    out = launch(tmp_path, """
try:
    c.insert(list(range(16)))  # write-through: its backups start at the next step
    t = time.time()
    while time.time() - t < 1.5:  # a wait loop that never steps
        c.pending()
        time.sleep(0.01)
    print("counted", c.stats()["no_step_warnings"], flush=True)
    # A caller built against the header before no_step_warnings gets the fields it has.
    import ctypes
    class OldStats(ctypes.Structure):
        _fields_ = cpcache._Stats._fields_[:-1]
    old = OldStats(struct_size=ctypes.sizeof(OldStats))
    status = cpcache.library().cpcache_get_stats(c._h, ctypes.cast(ctypes.byref(old), ctypes.POINTER(cpcache._Stats)))
    print("old size", ctypes.sizeof(OldStats), status, old.pending, flush=True)
    try:
        for k in range(1, 10):
            c.insert(list(range(100 * k, 100 * k + 16)))
        print("no L1FullError", flush=True)
    except cpcache.L1FullError as e:
        print("full:", e, flush=True)
finally:
    c.close()
""", env={"CPCACHE_STEP_WARN_MS": "300"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    lines = out.stdout.splitlines()
    for r in (0, 1):
        assert f"[{r}] counted 1" in lines, text
        assert f"[{r}] old size 224 0 1" in lines, text  # its backup pending
        full = [l for l in lines if l.startswith(f"[{r}] full:")]
        assert full and "copies start only at the next step()" in full[0], text
    warnings = [l for l in text.splitlines() if "no step() on this rank" in l]
    assert len(warnings) == 2, text  # once per rank's cache
    assert all("call step() once per scheduler step" in w for w in warnings), text


EXTRA_STEP = """
try:
    for i in range(3):
        c.insert(list(range(100 * i, 100 * i + 8)))
        c.step()
        if rank == 0 and i == {at}:
            c.step()  # the extra one
    if {at} == 2 and rank == 1:
        c.close()  # rank 1 is done; rank 0's extra step waits for it
    print("finished", flush=True)
except cpcache.Error as e:
    print("error", type(e).__name__, round(time.time() - start, 2), e, flush=True)
finally:
    c.close()
"""


@pytest.mark.parametrize("at", [1, 2], ids=["meets-the-next-step", "peer-closes"])
def test_an_extra_step_names_both_counts(tmp_path, at):
    out = launch(tmp_path, "start = time.time()\n" + EXTRA_STEP.replace("{at}", str(at)))
    text = out.stdout + out.stderr
    errors = {int(m.group(1)): m for m in re.finditer(r"^\[(\d)\] error (\w+) ([\d.]+) (.*)$", out.stdout, re.M)}
    if at == 1:
        # Rank 0's extra step met rank 1's third, made after its insert: both ranks are told.
        assert set(errors) == {0, 1}, text
        for m in errors.values():
            assert m.group(2) == "DivergedError", text
            assert "rank 0 had made 0 replicated calls since its previous step(), rank 1 had made 1" in m.group(4), text
            assert "call step() the same number of times" in m.group(4), text
            assert float(m.group(3)) < 5, text
    else:
        # Rank 1 made its 3 steps and closed; rank 0 waits in its 4th.
        assert set(errors) == {0}, text
        m = errors[0]
        assert m.group(2) == "PeerLostError", text
        assert "rank 1 has called step() 3 times, this rank 4 times" in m.group(4), text
        assert "every rank must call step() the same number of times" in m.group(4), text
        assert float(m.group(3)) < 5, text
