"""A process forked after libcpcache was loaded fails fast: each call raises
cpcache.ForkedError at once, naming the parent's pid; close() and the finalizer return at once
and touch nothing of the parent's cache, which keeps working. The Go runtime inside the library
does not survive a fork (only the forking thread does), so before this check a child's first
call hung in a futex, or ran on a copy of the parent's state and hung at exit.

Each shape runs in its own interpreter (python -c SCRIPT), which forks; the parent waits for
its child at most CHILD_DEADLINE seconds and kills it then, so a hang is a bounded failure.
The script prints one JSON line: what the child reported and what the parent saw."""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402
CHILD_DEADLINE = 10  # seconds a child has to report and exit

PRELUDE = textwrap.dedent(f"""
    import json, os, sys, time
    sys.path.insert(0, {os.path.join(ROOT, "python")!r})
    import cpcache
    CHILD_DEADLINE = {CHILD_DEADLINE}

    def attempt(fn):
        # (error class name, message) of what fn raised, or ("ok", repr of its result).
        try:
            return ["ok", repr(fn())]
        except Exception as e:
            return [type(e).__name__, str(e)]

    def wait_child(pid):
        # The child's exit status, or "hung" after CHILD_DEADLINE s (then it is killed).
        end = time.monotonic() + CHILD_DEADLINE
        while time.monotonic() < end:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return os.waitstatus_to_exitcode(st)
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"

    def read_report(r):
        os.set_blocking(r, False)
        try:
            data = os.read(r, 1 << 20)
        except BlockingIOError:
            data = b""
        return json.loads(data) if data else None

    def one_rank(store):
        return cpcache.Cache(world=1, rank=0, store="file://" + store, page_tokens=4, page_bytes=64,
                             l1_pages=8, l2_pages=16)

    def cache_and_step(c, seed):
        # Caches a fresh 2-page prompt, steps until idle; the match's device pages.
        tokens = [seed * 100 + i for i in range(8)]
        c.insert(tokens)
        c.step()
        while c.pending():
            c.step()
        return c.match(tokens).device_pages
""")


def run(script, tmp_path):
    out = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, CPCACHE_STORE=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no report: stdout {out.stdout!r} stderr {out.stderr!r}"
    return json.loads(lines[-1])


def assert_forked(got, parent, what):
    assert got[0] == "ForkedError", f"{what}: want ForkedError, got {got}"
    assert f"pid {parent}" in got[1] and "forked" in got[1], f"{what}: message must name the parent pid {parent}: {got[1]}"


def test_fork_without_a_cache(tmp_path):
    """os.fork() in a process that loaded the library (version()) but opened no cache: the
    child's version() answers, Cache() raises ForkedError naming the parent, and it exits."""
    rep = run("""
        parent, want = os.getpid(), cpcache.version()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            t0 = time.monotonic()
            rep = {"version": attempt(cpcache.version),
                   "cache": attempt(lambda: one_rank(os.environ["CPCACHE_STORE"]))}
            rep["secs"] = time.monotonic() - t0
            os.write(w, json.dumps(rep).encode())
            sys.exit(0)  # the interpreter's own exit: finalizers and atexit run
        os.close(w)
        status = wait_child(pid)
        print(json.dumps({"parent": parent, "want": want, "status": status, "child": read_report(r)}))
    """, tmp_path)
    assert rep["status"] == 0, f"child: {rep}"
    child = rep["child"]
    assert child["version"] == ["ok", repr(rep["want"])]
    assert_forked(child["cache"], rep["parent"], "Cache()")
    assert issubclass(cpcache.ForkedError, cpcache.Error)


def test_fork_with_a_cache_open(tmp_path):
    """os.fork() with a cache open in the parent: the child's step(), match() and a second
    Cache() raise ForkedError naming the parent, its close() and its finalizer (at its exit)
    return at once; the parent's cache keeps caching and stepping, its store untouched."""
    rep = run("""
        store = os.environ["CPCACHE_STORE"]
        c = one_rank(store)
        before = cache_and_step(c, 1)
        files = sorted(os.listdir(store))
        parent = os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            t0 = time.monotonic()
            rep = {"step": attempt(c.step), "match": attempt(lambda: c.match([100, 101, 102, 103])),
                   "open": attempt(lambda: one_rank(store)), "close": attempt(c.close)}
            rep["secs"] = time.monotonic() - t0
            os.write(w, json.dumps(rep).encode())
            del c
            sys.exit(0)  # the finalizers of the parent's objects run here
        os.close(w)
        status = wait_child(pid)
        child = read_report(r)
        files_after = sorted(os.listdir(store))
        after = [cache_and_step(c, seed) for seed in range(2, 6)]
        c.close()
        print(json.dumps({"parent": parent, "status": status, "child": child, "before": before,
                          "after": after, "files_same": files == files_after}))
    """, tmp_path)
    assert rep["status"] == 0, f"child: {rep}"
    child = rep["child"]
    for call in ("step", "match", "open"):
        assert_forked(child[call], rep["parent"], call)
    assert child["close"] == ["ok", "None"], "close() in a forked child returns at once, without error"
    assert rep["before"] == 2 and rep["after"] == [2, 2, 2, 2], rep
    assert rep["files_same"], "the child changed the parent's store"


def test_multiprocessing_fork(tmp_path):
    """multiprocessing's fork start method (vLLM's default) with a cache open in the parent:
    the worker's calls raise ForkedError naming the parent, and it exits; the parent steps on."""
    rep = run("""
        import multiprocessing as mp
        store = os.environ["CPCACHE_STORE"]
        c = one_rank(store)
        cache_and_step(c, 1)

        def worker(q):
            q.put({"version": attempt(cpcache.version), "step": attempt(c.step),
                   "stats": attempt(c.stats), "open": attempt(lambda: one_rank(store))})

        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=worker, args=(q,))
        p.start()
        p.join(CHILD_DEADLINE)
        hung = p.is_alive()
        if hung:
            p.kill()
            p.join()
        child = None if q.empty() else q.get(timeout=1)
        after = [cache_and_step(c, seed) for seed in range(2, 4)]
        c.close()
        print(json.dumps({"parent": os.getpid(), "hung": hung, "exitcode": p.exitcode, "child": child,
                          "want": cpcache.version(), "after": after}))
    """, tmp_path)
    assert not rep["hung"] and rep["exitcode"] == 0, rep
    child = rep["child"]
    assert child["version"] == ["ok", repr(rep["want"])]
    for call in ("step", "stats", "open"):
        assert_forked(child[call], rep["parent"], call)
    assert rep["after"] == [2, 2]
