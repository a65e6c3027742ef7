"""Two ranks that open a Cache with arguments of their own and close it, under `cpcache launch
-n 2`: what a test of open's cross-rank checks runs (test_cpcache.py, test_errors.py). Run
as a script it is one rank: Cache(**defaults, **its own), printing "opened" or the error's
class and message."""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def open_two_ranks(cpcache_bin, defaults, rank0, rank1, store=None):
    """Launches two ranks with the cpcache binary cpcache_bin, each opening Cache(**defaults, **rank<r>); returns their lines
    ("[r] opened" or "[r] ErrorClass: message"), sorted, and the whole output."""
    env = dict(os.environ, CPCACHE_TEST_DEFAULTS=json.dumps(defaults),
               CPCACHE_TEST_RANK0=json.dumps(rank0), CPCACHE_TEST_RANK1=json.dumps(rank1))
    launch = [cpcache_bin, "launch", "-n", "2"] + (["--store", store] if store else [])
    out = subprocess.run(launch + ["--", sys.executable, os.path.abspath(__file__)],
                         capture_output=True, text=True, timeout=120, env=env)
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("["))
    assert len(lines) == 2, out.stdout + out.stderr
    return lines, out.stdout + out.stderr


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import cpcache
    kw = json.loads(os.environ["CPCACHE_TEST_DEFAULTS"])
    kw.update(json.loads(os.environ["CPCACHE_TEST_RANK" + os.environ["RANK"]]))
    try:
        cpcache.Cache(**kw).close()
        print("opened", flush=True)
    except cpcache.Error as e:
        print(type(e).__name__ + ": " + str(e), flush=True)
