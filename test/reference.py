#!/usr/bin/env python3
"""Checks (or, with --update, writes) the parts of docs/reference.md whose source is the code
other than Go's (cmd/cpcache's TestReferenceRunFlags writes the flag table):

- "c-statuses": every status of include/cpcache.h (`#define CPCACHE_OK` / `CPCACHE_ERR_*`),
  its value and the header's comment, with the Python exception the binding raises for it;
- "python-exceptions": every exception class of python/cpcache, its status, what it also is
  (a builtin it derives from) and its other names.

It also checks docs/troubleshooting.md: every entry is headed by a piece of an error message
(`### \`...\``), which must occur in the source (Go outside tests, C, the Python binding) on
one line, its parts around " ... " in order.

A section sits between `<!-- generated: NAME ... -->` and `<!-- end generated: NAME -->`.
Exit status 1, naming the section, when the file differs from what the code gives, or when the
header and the binding disagree (a status without an exception, or the other way round).
`make readme-test` runs it.
"""
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "reference.md")
HEADER = os.path.join(ROOT, "include", "cpcache.h")
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402  (the binding loads libcpcache only when a call needs it)

STATUS = re.compile(r"^#define (CPCACHE_(?:OK|ERR_[A-Z0-9_]+)) \(?(-?\d+)\)?\s*(?:/\*(.*))?$")


def statuses():
    """(name, value, comment) of every status the header defines, in its order."""
    out = []
    lines = open(HEADER).read().split("\n")
    for i, line in enumerate(lines):
        m = STATUS.match(line)
        if not m:
            continue
        name, value, comment = m.group(1), int(m.group(2)), (m.group(3) or "").strip()
        while comment and not comment.endswith("*/"):
            i += 1
            comment += " " + lines[i].strip().lstrip("*").strip()
        out.append((name, value, comment.removesuffix("*/").strip()))
    return out


def cell(s):
    return s.replace("|", "\\|").replace("\n", " ")


def names(cls):
    """The module's names of a class, its own first."""
    return [cls.__name__] + sorted(n for n, v in vars(cpcache).items() if v is cls and n != cls.__name__)


def c_statuses(errors):
    rows = ["| status | value | meaning | Python |", "| --- | --- | --- | --- |"]
    for name, value, comment in statuses():
        py = "—" if value == 0 else "`%s`" % errors[value].__name__
        rows.append("| `%s` | %d | %s | %s |" % (name, value, cell(comment or "success"), py))
    return "\n".join(rows) + "\n"


def python_exceptions(errors):
    status = {v: n for n, v, _ in statuses()}
    rows = ["| exception | C status | also | meaning |", "| --- | --- | --- | --- |"]
    doc = inspect.getdoc(cpcache.Error).split("\n\n")[0].replace("\n", " ")
    rows.append("| `Error` | every one (`e.code`) | `Exception` | %s |" % cell(doc))
    comments = {n: c for n, _, c in statuses()}
    for value, cls in sorted(errors.items(), key=lambda kv: -kv[0]):
        also = [b.__name__ for b in cls.__mro__[1:] if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
        other = names(cls)[1:]
        extra = ", ".join("`%s`" % n for n in also + other) or "—"
        own = inspect.getdoc(cls) if cls.__doc__ else None
        meaning = (own.split("\n\n")[0].replace("\n", " ") if own else comments[status[value]])
        rows.append("| `%s` | `%s` | %s | %s |" % (cls.__name__, status[value], extra, cell(meaning)))
    return "\n".join(rows) + "\n"


def sections():
    errors = dict(cpcache._ERRORS)
    header = {v for _, v, _ in statuses()} - {0}
    problems = []
    for v in sorted(header - set(errors)):
        problems.append("include/cpcache.h's status %d has no exception in python/cpcache (_ERRORS)" % v)
    for v in sorted(set(errors) - header):
        problems.append("python/cpcache's _ERRORS maps %d, which include/cpcache.h does not define" % v)
    for v, cls in errors.items():
        if not issubclass(cls, cpcache.Error):
            problems.append("python/cpcache's exception for %d, %s, is not a cpcache.Error" % (v, cls.__name__))
    if problems:
        return None, problems
    return {"c-statuses": c_statuses(errors), "python-exceptions": python_exceptions(errors)}, []


TROUBLE = os.path.join(ROOT, "docs", "troubleshooting.md")


def source_lines():
    """The lines of the code that writes messages: Go (not tests), C and the Python binding."""
    for top in ("cmd", "csrc", "gloo", "hicache", "include", "internal", "job", "nccl", "cuda", "parallel",
                "slab", "storage", "sim", "workload", "zmq", os.path.join("python", "cpcache")):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(("_test.go", "_fake.c")) or not f.endswith((".go", ".c", ".h", ".py")):
                    continue
                with open(os.path.join(d, f), errors="replace") as fh:
                    yield from fh


def missing_messages():
    """The troubleshooting entries whose message the source no longer writes."""
    wanted = re.findall(r"^### `(.+)`$", open(TROUBLE).read(), flags=re.M)
    if not wanted:
        return ["docs/troubleshooting.md has no entries (### `message`)"]
    patterns = {w: re.compile(".*?".join(re.escape(p) for p in w.split(" ... "))) for w in wanted}
    left = set(wanted)
    for line in source_lines():
        for w in list(left):
            if patterns[w].search(line):
                left.discard(w)
        if not left:
            break
    return ["docs/troubleshooting.md's entry %r: no such message in the source" % w for w in sorted(left)]


def main(argv):
    update = argv[:1] == ["--update"]
    gone = missing_messages()
    for p in gone:
        print("reference: " + p)
    if gone:
        return 1
    want, problems = sections()
    for p in problems:
        print("reference: " + p)
    if problems:
        return 1
    doc = open(DOC).read()
    failed = []
    for name, text in want.items():
        begin, end = "<!-- generated: %s " % name, "<!-- end generated: %s -->" % name
        i, j = doc.find(begin), doc.find(end)
        if i < 0 or j < i:
            print("reference: docs/reference.md has no %r ... %r markers" % (begin, end))
            return 1
        i = doc.index("-->\n", i) + 4
        if doc[i:j] != text:
            if update:
                doc = doc[:i] + text + doc[j:]
            else:
                failed.append(name)
    if update:
        open(DOC, "w").write(doc)
    for name in failed:
        print("reference: docs/reference.md's generated %s is not the code's: run test/reference.py --update "
              "(include/cpcache.h and python/cpcache are the source)" % name)
    if not failed:
        print("reference: docs/reference.md's %s are the code's" % " and ".join(want))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
