"""The test an engine team would write: the engine's parent holds a torch.distributed.TCPStore
(as its dist_init_method), spawns its scheduler processes with multiprocessing (spawn), and
each opens its cache through that store with store= and job_id=. The example is docs/python.md's
section "An engine's processes", read from docs/python.md by its marker and run as written.

Needs torch (Debian's python3-torch, make deps); skipped where `import torch` fails.
"""

import hashlib
import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402

dist = pytest.importorskip("torch.distributed", reason="torch is not importable here (python3-torch: make deps)")

MARKER = "<!-- engine-processes-example -->"


DOC = os.path.join("docs", "python.md")


def doc_example():
    """The ```python block that follows MARKER in docs/python.md."""
    with open(os.path.join(ROOT, DOC)) as f:
        text = f.read()
    assert MARKER in text, DOC + " lost its engine-processes example marker"
    m = re.search(r"```python\n(.*?)\n```", text.split(MARKER, 1)[1], flags=re.S)
    assert m, "no ```python block after the marker"
    return m.group(1) + "\n"


@pytest.fixture
def example(tmp_path, monkeypatch):
    """docs/python.md's example as a module (engine_example) that spawned children import too."""
    (tmp_path / "engine_example.py").write_text(doc_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("engine_example", None)
    import engine_example
    return engine_example


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    env.setdefault("CPCACHE_LIBRARY", cpcache.library()._name)
    return env


def test_doc_example_runs_as_written(tmp_path):
    script = tmp_path / "engine_example.py"
    script.write_text(doc_example())
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(4):
        assert f"engine-job-1 rank {rank}: served 4 prompts, shared prefix hit" in r.stdout, r.stdout + r.stderr


def serve_recorded(tp_rank, world, init, job_id, outdir):
    """docs/python.md's serve, with every key this process's TCPStore clients are asked about
    recorded (to show that cpcache touches only keys under cpcache/)."""
    import torch.distributed as tdist
    import engine_example

    keys = set()

    class RecordingTCPStore(tdist.TCPStore):
        def set(self, key, value):
            keys.add(key)
            return super().set(key, value)

        def get(self, key):
            keys.add(key)
            return super().get(key)

        def add(self, key, delta):
            keys.add(key)
            return super().add(key, delta)

        def delete_key(self, key):
            keys.add(key)
            return super().delete_key(key)

        def wait(self, keys_, *args):
            keys.update(keys_)
            return super().wait(keys_, *args)

    tdist.TCPStore = RecordingTCPStore
    engine_example.dist.TCPStore = RecordingTCPStore
    engine_example.serve(tp_rank, world, init, job_id)
    with open(os.path.join(outdir, f"{job_id}-{tp_rank}.json"), "w") as f:
        json.dump(sorted(keys), f)


def test_two_jobs_on_the_engines_store(example, tmp_path):
    port = free_port()
    engine_store = dist.TCPStore("127.0.0.1", port, is_master=True)
    engine_store.set("engine/own", b"the engine's value")
    init = f"tcp://127.0.0.1:{port}"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=serve_recorded, args=(r, 4, init, job, str(tmp_path)))
             for job in ("job-a", "job-b") for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.exitcode is None:
            p.kill()
    assert codes == [0] * 8, f"exit codes of job-a ranks 0-3, job-b ranks 0-3: {codes}"
    assert engine_store.get("engine/own") == b"the engine's value"
    for job in ("job-a", "job-b"):
        space = "cpcache/job-" + hashlib.sha256(job.encode()).hexdigest()[:16]
        for r in range(4):
            with open(tmp_path / f"{job}-{r}.json") as f:
                keys = json.load(f)
            assert keys, "the store was not used"
            assert all(k.startswith(space + "/") for k in keys), \
                f"{job} rank {r} touched keys outside its space {space}/: {[k for k in keys if not k.startswith(space)][:5]}"


def open_outcome(rank, world, store, job_id, outfile, env=None):
    """Opens a cache (after the library is loaded, with env set through os.environ) and writes
    what happened: "ok" or the error's class and message."""
    import torch.distributed as tdist
    cpcache.library()
    for k, v in (env or {}).items():
        os.environ[k] = v
    if isinstance(store, tuple):
        store = tdist.TCPStore(store[0], store[1], is_master=False)
    # store= and job_id= only when given: the environment's test runs on any binding.
    kw = {k: v for k, v in (("store", store), ("job_id", job_id)) if v is not None}
    try:
        with cpcache.Cache(world=world, rank=rank, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16,
                           timeout_ms=4000, **kw):
            out = "ok"
    except cpcache.Error as e:
        out = f"{type(e).__name__}: {e}"
    with open(outfile, "w") as f:
        f.write(out)


def run_outcomes(tmp_path, argsets):
    ctx = mp.get_context("spawn")
    files = [str(tmp_path / f"outcome-{i}") for i in range(len(argsets))]
    procs = [ctx.Process(target=open_outcome, args=(*a[:4], f), kwargs=a[4] if len(a) > 4 else {})
             for a, f in zip(argsets, files)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    outs = []
    for p, f in zip(procs, files):
        assert p.exitcode == 0, f"a worker exited with {p.exitcode}"
        with open(f) as fh:
            outs.append(fh.read())
    return outs


def test_two_workers_given_rank_0_are_named(tmp_path):
    port = free_port()
    engine_store = dist.TCPStore("127.0.0.1", port, is_master=True)
    outs = run_outcomes(tmp_path, [(0, 2, ("127.0.0.1", port), "job-dup")] * 2)
    named = [o for o in outs if "two processes claim rank 0 of job job-dup" in o]
    assert len(named) == 1 and named[0].startswith("ConfigError"), outs
    del engine_store


def test_os_environ_set_in_python_counts(tmp_path):
    # CPCACHE_STORE and CPCACHE_JOB_ID set through os.environ after the library loaded (as a
    # spawned worker's code does): both reach the library, which names the job id.
    env = {"CPCACHE_STORE": f"file://{tmp_path}/store", "CPCACHE_JOB_ID": "env-job"}
    outs = run_outcomes(tmp_path, [(0, 2, None, None, {"env": env})] * 2)
    named = [o for o in outs if "two processes claim rank 0 of job CPCACHE_JOB_ID=env-job" in o]
    assert len(named) == 1, outs


def test_tcp_url_of_a_torch_store(tmp_path):
    # An engine's dist_init_method as it is: a client of that TCPStore is made for the cache.
    port = free_port()
    engine_store = dist.TCPStore("127.0.0.1", port, is_master=True)
    engine_store.set("engine/own", b"v")
    outs = run_outcomes(tmp_path, [(r, 2, f"tcp://127.0.0.1:{port}", "job-url") for r in range(2)])
    assert outs == ["ok", "ok"], outs
    assert engine_store.get("engine/own") == b"v"


def test_a_process_group_is_a_clear_type_error():
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    with pytest.raises(TypeError, match=r"store= takes a URL .* or a store object with set, get, add and delete_key"):
        cpcache.Cache(store=pg, world=1, rank=0, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16)


def test_missing_store_names_the_keyword(monkeypatch):
    monkeypatch.delenv("CPCACHE_STORE", raising=False)
    with pytest.raises(cpcache.ConfigError) as e:
        cpcache.Cache(world=2, rank=0, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16, timeout_ms=2000)
    assert "store=" in str(e.value) and "--store" not in str(e.value) and "cpcache_config" not in str(e.value)


def test_a_store_given_to_a_closed_cache_is_let_go(tmp_path):
    import gc
    import weakref

    class DictStore:  # the methods StoreAdapter needs, over a dict
        def __init__(self):
            self.d = {}

        def set(self, k, v):
            self.d[k] = bytes(v)

        def get(self, k):
            return self.d.get(k)

        def add(self, k, n):
            self.d[k] = str(int(self.d.get(k, b"0")) + n).encode()
            return int(self.d[k])

        def delete_key(self, k):
            return self.d.pop(k, None) is not None

    st = DictStore()
    st.set("engine/own", b"v")
    with cpcache.Cache(store=st, job_id="dict", world=1, rank=0, page_tokens=4, page_bytes=64, l1_pages=8, l2_pages=16):
        pass
    assert st.d["engine/own"] == b"v" and all(k == "engine/own" or k.startswith("cpcache/") for k in st.d), st.d
    ref = weakref.ref(st)
    del st
    gc.collect()
    assert ref() is None, "the closed cache's adapter keeps the store"
