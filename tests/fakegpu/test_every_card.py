"""One workload on every card of the catalog: sort, top-k, unique and an embedding's backward, above 4,096
elements (tests/fakegpu/every_card_job.py).

Above 4,096 elements PyTorch sorts with CUB's radix sort, whose tuning follows the kernel image the driver
runs. PyTorch's wheels carry no sm_89 code for most kernels, so an 8.9 card (RTX 4090, L4, L40S) runs the
sm_86 code and must allocate as an 8.6 card does. Only allocations sized by the multiprocessor count may
differ between cards of one capability (fakegpu/cudart/images.c, Note [Kernel images and the card's compute
capability]).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fakegpu import every_card_job as job
from torchmem import fakegpu


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    cards = sorted(fakegpu.CARDS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(cards, pool.map(lambda c: fakegpu.call(job.sort_paths, card=c, timeout=300), cards)))


def test_every_card_of_the_catalog_runs_the_sort_paths(runs):
    assert len(runs) == len(fakegpu.CARDS) == 12
    for name, run in runs.items():
        assert run["capability"] == [int(n) for n in fakegpu.card(name).capability.split(".")], name
    counts = {name: len(run["allocs"]) for name, run in runs.items()}
    assert len(set(counts.values())) == 1, counts
    # The sort's own outputs are the same bytes everywhere: 65,536 floats and 65,536 int64 indices.
    for run in runs.values():
        assert run["allocs"][:4] == [job.N * 4, job.N * 4, job.N * 8, job.N * 8]


def by_capability(runs: dict[str, dict], capability: str) -> dict[str, list[int]]:
    return {n: r["allocs"] for n, r in runs.items() if fakegpu.card(n).capability == capability}


def test_cards_of_one_capability_and_multiprocessor_count_allocate_alike(runs):
    groups: dict[tuple[str, int], list[list[int]]] = {}
    for name, run in runs.items():
        chosen = fakegpu.card(name)
        groups.setdefault((chosen.capability, chosen.multiprocessors), []).append(run["allocs"])
    shared = [g for g in groups.values() if len(g) > 1]
    assert shared, "the catalog has cards that share a capability and a multiprocessor count"
    for group in shared:
        assert all(allocs == group[0] for allocs in group)


def test_an_ada_card_allocates_as_an_ampere_86_card_but_for_multiprocessor_sized_buffers(runs):
    ada, ampere = by_capability(runs, "8.9"), by_capability(runs, "8.6")
    assert len(ada) == 3 and len(ampere) == 2
    # Positions where two Ada cards with other multiprocessor counts differ are sized by that count.
    by_sms = [i for i in range(len(ada["l4"])) if ada["l4"][i] != ada["rtx4090"][i]]
    assert len(by_sms) <= 2, by_sms
    reference = ampere["rtx3090"]
    for name, allocs in ada.items():
        differing = [i for i in range(len(allocs)) if allocs[i] != reference[i] and i not in by_sms]
        assert differing == [], (name, [(i, allocs[i], reference[i]) for i in differing])
    # Hopper decides CUB's temporary storage otherwise: the check above is not vacuous.
    hopper = by_capability(runs, "9.0")["h100-sxm"]
    assert [i for i in range(len(hopper)) if hopper[i] != reference[i] and i not in by_sms]
