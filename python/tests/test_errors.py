"""Issue 38, point 6: errors in the caller's terms. A KV-layout mismatch across ranks is
ConfigError naming the first differing part (before: IOError_ or a page_bytes difference);
TimeoutError_ and IOError_ are builtin TimeoutError and OSError (str(e) the message, code the
status); open()'s errors name Cache()'s arguments, not cpcache_config's fields."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import cpcache  # noqa: E402
from open_ranks import open_two_ranks  # noqa: E402

CPCACHE_BIN = os.environ.get("CPCACHE_BIN") or os.path.join(ROOT, "bin", "cpcache")


def test_timeout_and_io_errors_are_the_builtin_ones():
    assert issubclass(cpcache.TimeoutError_, TimeoutError) and issubclass(cpcache.TimeoutError_, OSError)
    assert issubclass(cpcache.IOError_, OSError) and issubclass(cpcache.IOError_, cpcache.Error)
    assert cpcache.CacheTimeoutError is cpcache.TimeoutError_ and cpcache.CacheIOError is cpcache.IOError_
    e = cpcache.IOError_(-13, "cpcache_step: a copy failed")
    assert str(e) == "cpcache_step: a copy failed" and e.code == -13 and e.args == ("cpcache_step: a copy failed",)
    assert e.errno is None
    try:
        raise e
    except OSError as caught:
        assert caught is e


def test_a_real_timeout_is_caught_as_timeout_error(tmp_path):
    """Rank 0 of 2 opens alone with timeout_ms 1000: `except TimeoutError` catches it, with
    the library's message (not "[Errno -12] ...") and the status."""
    try:
        cpcache.Cache(world=2, rank=0, store=f"file://{tmp_path}", page_tokens=4, page_bytes=64, l1_pages=8,
                      l2_pages=16, timeout_ms=1000)
    except TimeoutError as e:
        assert isinstance(e, cpcache.Error) and e.code == -12, e
        assert not str(e).startswith("[Errno") and "cpcache.Cache()" in str(e), str(e)
    else:
        pytest.fail("opened without rank 1")


def test_open_errors_name_the_python_arguments(tmp_path):
    kw = dict(world=1, rank=0, store=f"file://{tmp_path}", page_tokens=4, l1_pages=8, l2_pages=16)
    with pytest.raises(cpcache.InvalidError) as e:
        cpcache.Cache(kv_layers=3, page_bytes=64, **kw)
    assert "kv_layers 3 without kv_layout" in str(e.value), str(e.value)
    assert "kv_num_layers 3 without kv_parts" in e.value.c_message  # the library's own words
    with pytest.raises(cpcache.InvalidError, match=r'kv_layout\[1\] \("v"\): bytes_per_token 0'):
        cpcache.Cache(kv_layout=[("k", 16, cpcache.KV_SHARDED), ("v", 0, cpcache.KV_SHARDED)], kv_layers=2, **kw)
    with pytest.raises(cpcache.InvalidError, match="l1_base is None with l1_kind 1"):
        cpcache.Cache(l1_kind=cpcache.L1_HOST, page_bytes=64, **kw)


@pytest.mark.parametrize("rank1, want", [
    # k of 32 bytes on rank 1 (so its page_bytes differ too): the part, not page_bytes.
    (dict(kv_layout="layers=2;k=32:sharded;v=16:sharded"), "part 0 (k): bytes per token 16 vs 32"),
    (dict(kv_layout="layers=2;k=16:sharded;v=16:replicated"), "part 1 (v): sharding sharded vs replicated"),
    (dict(page_bytes=256), 'rank 1 has none (opaque pages)'),
])
def test_a_kv_layout_mismatch_is_a_config_error_naming_the_part(tmp_path, rank1, want):
    lines, _ = open_two_ranks(CPCACHE_BIN, dict(l1_pages=8, l2_pages=16, page_tokens=4, attn_cp=2, timeout_ms=20000),
                              dict(kv_layout="layers=2;k=16:sharded;v=16:sharded"), rank1, store=f"file://{tmp_path}/store")
    for line in lines:
        assert "ConfigError" in line and "ranks disagree on the KV layout" in line and want in line, line
        assert "page_bytes" not in line, line
