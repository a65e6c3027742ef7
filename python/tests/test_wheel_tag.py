"""The wheel backend's platform tag (python/build_backend/cpcache_wheel.py): manylinux_2_Y only
where the symbol versions the wheel's files need allow it, else linux_<machine>."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "build_backend"))
import cpcache_wheel  # noqa: E402


def tag_for(monkeypatch, needs, machine="x86_64"):
    """The tag of one ELF file whose .gnu.version_r is `needs` ({library: {version}})."""
    monkeypatch.setattr(cpcache_wheel, "_symbol_versions", lambda path: needs)
    return cpcache_wheel.platform_tag(["f.so"], machine)[0]


def test_glibc_alone_decides(monkeypatch):
    assert tag_for(monkeypatch, {"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.17"}}) == "manylinux_2_17_x86_64"
    assert tag_for(monkeypatch, {"libc.so.6": {"GLIBC_2.34"}, "libm.so.6": {"GLIBC_2.29"}}) == "manylinux_2_34_x86_64"


def test_libstdcxx_raises_the_floor(monkeypatch):
    # GCC 12's libstdc++ (GLIBCXX_3.4.30) is not in manylinux_2_34's policy: 2_35 is the first.
    needs = {"libc.so.6": {"GLIBC_2.34"}, "libstdc++.so.6": {"GLIBCXX_3.4.30", "CXXABI_1.3.13"},
             "libgcc_s.so.1": {"GCC_3.0"}}
    assert tag_for(monkeypatch, needs) == "manylinux_2_35_x86_64"
    needs["libstdc++.so.6"] = {"GLIBCXX_3.4.29"}
    assert tag_for(monkeypatch, needs) == "manylinux_2_34_x86_64"
    # A newer glibc than the C++ floor wins.
    needs["libc.so.6"] = {"GLIBC_2.36"}
    assert tag_for(monkeypatch, needs) == "manylinux_2_36_x86_64"


@pytest.mark.parametrize("needs,why", [
    ({"libc.so.6": {"GLIBC_2.34", "GLIBC_PRIVATE"}}, "GLIBC_PRIVATE of libc.so.6"),
    ({"libstdc++.so.6": {"GLIBCXX_3.4.40"}}, "a libstdc++ newer than"),
])
def test_no_manylinux_promise_it_cannot_keep(monkeypatch, needs, why):
    monkeypatch.setattr(cpcache_wheel, "_symbol_versions", lambda path: needs)
    tag, reason = cpcache_wheel.platform_tag(["f.so"], "x86_64")
    assert tag == "linux_x86_64"
    assert why in reason


def test_versions_of_bundled_libraries_do_not_count(monkeypatch):
    # Versions a file needs of a library the wheel carries (libibverbs' own) are not the system's.
    needs = {"libc.so.6": {"GLIBC_2.17"}, "libibverbs-f809f34b.so.1": {"IBVERBS_1.1"}}
    assert tag_for(monkeypatch, needs) == "manylinux_2_17_x86_64"


def test_a_machine_without_a_table_is_linux(monkeypatch):
    assert tag_for(monkeypatch, {"libc.so.6": {"GLIBC_2.17"}}, machine="riscv64") == "linux_riscv64"
