"""The reference model through the Python binding (python/examples/refmodel.py): a tiny
deterministic transformer whose per-layer K/V arrays are lent to the cache as its L1, in
engine-owned mode, serving multi-turn conversations; generations and final logits must equal
a cache-off run, with pages hit in L1 and loaded back from L2, and a damaged loaded layer
must show."""
import os
import sys

import pytest

np = pytest.importorskip("numpy", reason="numpy (Debian python3-numpy) is not installed")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python", "examples"))
import refmodel  # noqa: E402


def _check_equal_with_hits(off, on, stats, all_back, loaded_requests, computed):
    assert len(on) == 9 and all(len(a) == 6 for a, _ in on)
    assert on == off, [i for i, (x, y) in enumerate(zip(off, on)) if x != y]
    assert stats["l1_hit_pages"] > 0, stats
    assert stats["l2_hit_pages"] > 0 and stats["loaded_pages"] > 0, stats
    assert loaded_requests > 0
    assert computed[1] < computed[0], f"prompt tokens computed with the cache {computed[1]}, without {computed[0]}"
    assert all_back, "slots the cache never handed back to the engine's allocator"


@pytest.mark.parametrize("l2_layout", ["page_first", "layer_first"])
def test_numpy_cache_on_equals_cache_off(l2_layout):
    _check_equal_with_hits(*refmodel.run(l1_pages=16, l2_layout=l2_layout))


def test_answers_depend_on_the_conversation():
    """The comparison is not vacuous: different conversations give different answers."""
    a = refmodel.serve(refmodel.Engine(refmodel.Model(), 1024), refmodel.conversations(seed=7))
    b = refmodel.serve(refmodel.Engine(refmodel.Model(), 1024), refmodel.conversations(seed=8))
    assert [x for x, _ in a] != [x for x, _ in b]


def test_a_damaged_loaded_layer_changes_the_outputs():
    """Corrupting layer 2's K of one page loaded back from L2, after its wait and before the
    model reads it: some request's logits (and so the comparison) must differ."""
    damaged = []

    def damage(ks, vs, layer, loaded_slots):
        if layer == 2:
            ks[2][loaded_slots[0] * refmodel.PAGE_TOKENS] += np.float32(1.0)
            damaged.append(loaded_slots[0])

    off, on, stats, _, _, _ = refmodel.run(l1_pages=16, damage=damage)
    assert damaged and stats["loaded_pages"] > 0
    assert on != off
    assert sum(x[1] != y[1] for x, y in zip(off, on)) > 0


def test_torch_tensors_lent_cache_on_equals_cache_off():
    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 — any import failure means no torch here
        pytest.skip(f"torch does not import (Debian python3-torch): {e}")
    _check_equal_with_hits(*refmodel.run(l1_pages=16, use_torch=True))
