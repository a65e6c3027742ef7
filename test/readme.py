#!/usr/bin/env python3
"""`make readme-test`: runs every shell command README.md and docs/*.md show, as written, and checks
their links.

The files are read in order (README.md, then docs/ by name), each as a user reads it. A code
block preceded by the line `<!-- file: NAME -->` is a file the text asks the reader to save:
it is written as NAME in the repository root (where every command runs) before the commands
after it, and removed at the end. Each ```sh block is read as a user reads it: lines joined at a trailing backslash, a
"$ " prompt marks a command whose output follows (compared exactly), a comment `# exit N` is the
status the command must end with (0 otherwise), a comment `# hit rate X%, N prefill tokens` is a
figure the output must show. Commands ending in `&` run in the background for the rest of their
block and are then interrupted (SIGINT, as Ctrl-C). Every block runs in the repository root,
under a HOME of its own (so `~/...` and `PREFIX=$HOME/.local` stay inside the test's
directory), with PATH holding the installed binary; a system-wide install (`make install`
without PREFIX, `cmake --install` to /opt) gets DESTDIR under the test's directory, which README
names as the packaging switch, so the test writes nothing outside it. A local redis-server
serves redis://127.0.0.1:6379 for the commands that name it.

What cannot run on one machine without a GPU is skipped, and each skip prints its reason: two
machines (`-H a:8,b:8`, a hostfile, a server named `a`), a GPU (`--device cuda`, unless
/dev/nvidia0 exists; the example engine's `--device N`, unless the command names the fake driver
with CPCACHE_CUDA_LIBRARY), elided flags (`...`), placeholders (`./my-rank-binary`), a user's own TLS
Redis, and `make test` itself (which runs this test). A command that another target of `make
test` runs (the Python suite, run by capi-test; `make install`, by install-test; `make wheel`,
by wheel-test; the CMake build, by cmake-test; the torch engine's run without storage, by
capi-test) is skipped naming that target (RUN_BY); each rule names the line that
target runs it from, and the test fails when that line is gone.

What the commands write at the repository's top that was not there before is removed at the end.
Every relative link (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`) must name a
file or directory that exists, and an anchor a heading of the target Markdown file (GitHub's
anchors: lower case, punctuation dropped, spaces to hyphens); a broken one fails the test
before any command runs.

`test/readme.py FILE...` runs only those files (their links are checked all the same);
`test/readme.py --links` checks the links alone.

Exit status 0 when every command ran as written and no link is broken; each failure prints its
command, status and output tail.
"""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = int(os.environ.get("CPCACHE_README_TIMEOUT", "600"))

# The example engine's device mode (`engine --device N`): the CUDA driver's, unless the command
# gives it CPCACHE_CUDA_LIBRARY (the fake).
ENGINE_DEVICE = re.compile(r"--device \d")
# A command for two machines; a block holding one line "# on host ..." is a two-machine setup.
TWO_MACHINES = re.compile(r"-H a:|--hostfile|redis://a:|@a:|/opt/cpcache/bin")
SKIPS = [
    (re.compile(r"^make (test|demo)\b"),
     "make test runs this test; make demo runs `cpcache run --clients 64 --rounds 12 --turn-gap 4s`, which docs/operating.md shows"),
    (re.compile(r"(^|\s)\.\.\.(\s|$)"), "flags elided with ..."),
    (re.compile(r"my-rank-binary"), "a placeholder for the user's own program"),
    (re.compile(r"rediss://"), "the user's own TLS Redis server"),
    (re.compile(r"^(?!.*PKG_CONFIG_PATH).*pkg-config --cflags --libs cpcache"),
     "test/install.sh builds the example with the installed pkg-config file"),
]
# A command that another target of `make test` already runs (the same command, or the same
# steps on a temporary prefix or store) is skipped here, naming that target: running it twice
# shows nothing more and costs minutes of CI. Each rule names where that target runs it (a file
# and a pattern in it); when the pattern is no longer there the rule no longer holds, and the
# test fails, so that the command runs here again or the rule is mended.
RUN_BY = [
    (re.compile(r"^/usr/bin/python3 -m pytest python/tests$"), "capi-test",
     "Makefile", r"\$\(TEST_PYTHON\) -m pytest -q -p no:cacheprovider python/tests$",
     "the Python suite, the same tests"),
    (re.compile(r"^make install$"), "install-test",
     "test/install.sh", r'^make -s install DESTDIR="\$tmp/stage" PREFIX=/usr/local ',
     "make install into a DESTDIR, then the installed binary, C example and Python package used from another directory"),
    (re.compile(r"^make wheel$"), "wheel-test",
     "Makefile", r"^wheel-test: wheel$",
     "its prerequisite, then the wheel installed and run"),
    (re.compile(r"^cmake -S \. -B build/cmake -DCMAKE_INSTALL_PREFIX=\S+ && cmake --build build/cmake && cmake --install build/cmake$"),
     "cmake-test", "Makefile", r"^\tcmake -S \. -B build/cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=",
     "configure, build and install to a temporary prefix, then find_package(cpcache) from an outside project"),
    (re.compile(r"^/usr/bin/python3 python/examples/torch_engine\.py --world 4 --attn-cp 2 --requests 12$"), "capi-test",
     "python/tests/test_torch_engine.py", r'^REQUESTS = 12$(?s:.*)^    rc, got, out = run_engine\("--world", "4", "--attn-cp", "2"\)$',
     "the Python suite's test_two_replicas_of_cp_2: every output checked, none differing, L1 hits"),
]

FIGURES = [
    (re.compile(r"hit rate (\d+\.\d)%"), lambda v: re.compile(r"hit rate\s+" + re.escape(v) + "%")),
    (re.compile(r"(\d+) prefill tokens"), lambda v: re.compile(r"\b" + re.escape(v) + r"\b")),
]


FILE_MARK = re.compile(r"^<!-- file: ([A-Za-z0-9_.-]+) -->$")


def blocks(text):
    """Yields (line number, lines, file name or None) of every ```sh block (file None) and of
    every block a `<!-- file: NAME -->` line names (its NAME)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        mark = FILE_MARK.match(lines[i - 1].strip()) if i > 0 else None
        if lines[i].startswith("```") and (lines[i].strip() == "```sh" or mark):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            yield start + 1, body, mark.group(1) if mark else None
        elif lines[i].startswith("```"):  # another block: skip it whole (a "```sh" inside is text)
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
        i += 1


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a heading's text."""
    h = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def anchors(path):
    """The anchors of a Markdown file's headings (outside code blocks), with GitHub's -1, -2
    for repeated ones."""
    seen, out, fence = {}, set(), False
    with open(path) as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6} (.*)", line)
            if m:
                a = anchor(m.group(1))
                n = seen.get(a, 0)
                seen[a] = n + 1
                out.add(a if n == 0 else "%s-%d" % (a, n))
    return out


def broken_links(path):
    """(line number, link, why) of every relative link of a Markdown file that leads nowhere."""
    out, fence = [], False
    with open(path) as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, file:
                continue
            file, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                out.append((n, target, "no such file: %s" % os.path.relpath(dest, ROOT)))
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                out.append((n, target, "no heading with anchor #%s in %s" % (frag, os.path.relpath(dest, ROOT))))
    return out


def stale_run_by():
    """(target, file, pattern) of every RUN_BY rule whose target no longer runs the command: the
    pattern is not in the file any more."""
    out = []
    for _, target, where, evidence, _ in RUN_BY:
        with open(os.path.join(ROOT, where)) as f:
            if not re.search(evidence, f.read(), re.M):
                out.append((target, where, evidence))
    return out


def documents():
    """README.md, then docs/*.md by name."""
    docs = os.path.join(ROOT, "docs")
    return ["README.md"] + sorted("docs/" + f for f in os.listdir(docs) if f.endswith(".md"))


def commands(start, body):
    """Yields (line number, command, comment, expected output or None) of a block."""
    i = 0
    while i < len(body):
        line, n = body[i], start + i
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        prompt = line.startswith("$ ")
        if prompt:
            line = line[2:]
        while line.endswith("\\") and i + 1 < len(body):
            i += 1
            line = line[:-1] + " " + body[i].strip()
        cmd, comment = split_comment(line)
        expected = None
        if prompt:
            out = []
            while i + 1 < len(body) and not body[i + 1].startswith("$ "):
                i += 1
                out.append(body[i])
            expected = "\n".join(out).rstrip()
        yield n, cmd.strip(), comment, expected
        i += 1


def split_comment(line):
    """Splits a shell line at its first # outside quotes that starts a word."""
    quote = None
    for j, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (j == 0 or line[j - 1] in " \t"):
            return line[:j], line[j + 1:].strip()
    return line, ""


def listening(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Runner:
    def __init__(self, tmp):
        self.tmp = tmp
        self.doc = "README.md"
        self.home = os.path.join(tmp, "home")
        self.stage = os.path.join(tmp, "stage")
        os.makedirs(self.home)
        self.env = dict(os.environ)
        # The installed binary first; the user's own tools (go, cc) after it, but not the
        # repository's bin/, so that every cpcache the commands run is the installed one.
        inherited = [d for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")
                     if d and os.path.realpath(d) != os.path.join(ROOT, "bin")]
        self.env.update(HOME=self.home, PATH=":".join([
            os.path.join(self.home, ".local/bin"), os.path.join(self.stage, "usr/local/bin")] + inherited))
        # A user's Go caches stay where they are (HOME moved; Go finds them from HOME).
        for k in ("GOPATH", "GOCACHE", "GOMODCACHE"):
            self.env[k] = subprocess.run(["go", "env", k], capture_output=True, text=True, check=True).stdout.strip()
        for k in ("CPCACHE_STORE", "CPCACHE_LIBRARY", "CPCACHE_BIN", "PYTHONPATH", "DESTDIR"):
            self.env.pop(k, None)
        if os.geteuid() == 0:
            # README: "add --allow-run-as-root to every mpirun command here when you run them as
            # root"; OpenMPI reads the same permission from these variables.
            self.env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.redis = None
        self.passed, self.failed, self.skipped = [], [], []

    def close(self):
        if self.redis:
            self.redis.terminate()
            self.redis.wait(10)

    def need_redis(self):
        if self.redis or listening(6379):
            return
        self.redis = subprocess.Popen(["redis-server", "--port", "6379", "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", self.tmp],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while not listening(6379):
            if time.time() > deadline:
                raise RuntimeError("redis-server did not listen on 127.0.0.1:6379 within 10 s")
            time.sleep(0.1)

    def env_for(self, cmd):
        env = dict(self.env)
        system_install = (re.match(r"make install\b", cmd) and "PREFIX=" not in cmd) or \
            ("cmake --install" in cmd and "-DCMAKE_INSTALL_PREFIX=/opt" in cmd)
        if system_install:
            env["DESTDIR"] = self.stage
        return env

    def skip_reason(self, cmd):
        if "--device cuda" in cmd and not os.path.exists("/dev/nvidia0"):
            return "needs a GPU"
        if ENGINE_DEVICE.search(cmd) and "CPCACHE_CUDA_LIBRARY=" not in cmd and not os.path.exists("/dev/nvidia0"):
            return "needs a GPU (the example engine's device mode on the real driver)"
        if TWO_MACHINES.search(cmd):
            return "needs two machines (README's two-machine guide)"
        for pattern, reason in SKIPS:
            if pattern.search(cmd):
                return reason
        for pattern, target, where, evidence, what in RUN_BY:
            if pattern.search(cmd):
                return "run by make %s (part of make test: %s; %s)" % (target, what, where)
        return None

    def save(self, where, name, body):
        """Writes a file the text asks the reader to save (a `<!-- file: NAME -->` block)."""
        with open(os.path.join(ROOT, name), "w") as f:
            f.write("\n".join(body) + "\n")
        print("FILE  %s  %s  (saved, as the text asks)" % (where, name), flush=True)

    def run_block(self, doc, start, body):
        self.doc = doc
        cmds = list(commands(start, body))
        if any(comment.startswith("on host") for _, _, comment, _ in cmds):
            for n, c, _, _ in cmds:
                self.skip(n, c, "needs two machines (README's two-machine guide)")
            return
        background = []
        try:
            for n, cmd, comment, expected in cmds:
                reason = self.skip_reason(cmd)
                if reason:
                    self.skip(n, cmd, reason)
                    continue
                if "redis://127.0.0.1:6379" in cmd:
                    self.need_redis()
                if "file:///tmp/cpc-store" in cmd:
                    shutil.rmtree("/tmp/cpc-store", ignore_errors=True)
                if cmd.endswith("&"):
                    log = open(os.path.join(self.tmp, "bg-%d.log" % n), "w+")
                    p = subprocess.Popen(["bash", "-c", cmd[:-1]], cwd=ROOT, env=self.env_for(cmd),
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                    background.append((n, cmd, p, log))
                    continue
                self.run(n, cmd, comment, expected)
        finally:
            for n, cmd, p, log in background:
                self.stop(n, cmd, p, log)

    def run(self, n, cmd, comment, expected):
        want = 0
        m = re.search(r"\bexit (\d+)\b", comment)
        if m:
            want = int(m.group(1))
        t0 = time.time()
        try:
            r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=self.env_for(cmd), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=TIMEOUT, start_new_session=True)
            out, status = r.stdout.decode(errors="replace"), r.returncode
        except subprocess.TimeoutExpired as e:
            out, status = (e.stdout or b"").decode(errors="replace"), "timeout after %d s" % TIMEOUT
        took = time.time() - t0
        problems = []
        if status != want:
            problems.append("exit status %s, want %d" % (status, want))
        if expected is not None and out.rstrip() != expected:
            problems.append("output differs from README:\n--- README\n%s\n--- got\n%s" % (expected, out.rstrip()))
        for pattern, check in FIGURES:
            for v in pattern.findall(comment):
                if not check(v).search(out):
                    problems.append("README states %r; the output does not show it" % pattern.pattern.replace(r"(\d+\.\d)", v).replace(r"(\d+)", v))
        if problems:
            self.failed.append(n)
            print("FAIL  %s:%d  %s  (%.0f s)\n      %s\n      output tail:\n%s" % (
                self.doc, n, cmd, took, "\n      ".join(problems), indent(out[-3000:])), flush=True)
        else:
            self.passed.append(n)
            print("PASS  %s:%d  %s  (%.0f s)" % (self.doc, n, cmd, took), flush=True)

    def stop(self, n, cmd, p, log):
        """Interrupts a background command (Ctrl-C) and checks it ended on it."""
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            self.failed.append(n)
            log.seek(0)
            print("FAIL  %s:%d  %s\n      still running 60 s after SIGINT\n%s" % (self.doc, n, cmd, indent(log.read()[-3000:])), flush=True)
            return
        self.passed.append(n)
        print("PASS  %s:%d  %s  (in the background; ended by SIGINT with status %d)" % (self.doc, n, cmd, p.returncode), flush=True)

    def skip(self, n, cmd, reason):
        self.skipped.append(n)
        print("SKIP  %s:%d  %s\n      (%s)" % (self.doc, n, cmd, reason), flush=True)


def indent(s):
    return "\n".join("        " + line for line in s.rstrip().split("\n"))


def main(argv):
    docs = documents()
    broken = [(d, n, link, why) for d in docs for n, link, why in broken_links(os.path.join(ROOT, d))]
    for d, n, link, why in broken:
        print("FAIL  %s:%d  link %s: %s" % (d, n, link, why), flush=True)
    if broken:
        print("readme-test: %d broken links" % len(broken))
        return 1
    print("readme-test: the links of %s lead somewhere" % ", ".join(docs), flush=True)
    stale = stale_run_by()
    for target, where, evidence in stale:
        print("FAIL  a command is skipped as run by make %s, but %s no longer matches %r: run it here again "
              "(drop the rule from RUN_BY) or mend the rule" % (target, where, evidence), flush=True)
    if stale:
        return 1
    if argv[:1] == ["--links"]:
        return 0
    if argv:
        unknown = [a for a in argv if a not in docs]
        if unknown:
            print("readme-test: not a document it runs: %s (these are: %s)" % (", ".join(unknown), ", ".join(docs)))
            return 2
        docs = argv
    shutil.rmtree("/tmp/cpc-l3", ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix="cpcache-readme-")
    runner = Runner(tmp)
    before = set(os.listdir(ROOT))
    try:
        for doc in docs:
            with open(os.path.join(ROOT, doc)) as f:
                text = f.read()
            for start, body, name in blocks(text):
                if name:
                    runner.save("%s:%d" % (doc, start), name, body)
                else:
                    runner.run_block(doc, start, body)
    finally:
        runner.close()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree("/tmp/cpc-store", ignore_errors=True)
        shutil.rmtree("/tmp/cpc-l3", ignore_errors=True)  # docs/python.md's store, filled then read
        # What the commands wrote at the repository's top (the files the text asks to save,
        # `-o engine`, `--json report.json`, make's bin/ and dist/) goes, so that the test
        # leaves the tree as it was.
        for name in sorted(set(os.listdir(ROOT)) - before):
            path = os.path.join(ROOT, name)
            print("readme-test: removing %s, which the commands made" % name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
    print("readme-test: %d commands ran as written, %d failed, %d skipped" % (
        len(runner.passed), len(runner.failed), len(runner.skipped)))
    return 1 if runner.failed or not runner.passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
