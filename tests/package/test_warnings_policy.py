"""pytest.ini's warning filters: a deprecation raised in torchmem's own code fails the test; others' do not."""
import warnings

import pytest


@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_a_deprecation_in_torchmem_fails(category):
    with pytest.raises(category):
        warnings.warn_explicit("a deprecated call", category, "torchmem/runtime/cuda.py", 1,
                               module="torchmem.runtime.cuda")


def test_another_packages_deprecation_is_left_to_it():
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit("a deprecated call", DeprecationWarning, "other/x.py", 1, module="other.x")
    assert caught == []
