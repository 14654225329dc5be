"""Note [Start segments' ages]: the replay says where it chose between start segments of unknown age.

Snapshots written by hand, in torch 2.14's layout (its allocator_settings
carry max_cached_size, so ties between equal free blocks go to the older
segment). Two 40 MiB segments existed when recording began; the trace's
first entry allocates 30 MiB. PyTorch served the older segment; the snapshot
does not say which that was, so the replay guesses, and must say so there.
"""
from __future__ import annotations

import pickle

from torchmem import replay as sim
from torchmem.replay.advise import search
from torchmem.replay.advise_words import verdict

MiB = 1 << 20
LOW, HIGH = 1 << 40, (1 << 40) + 64 * MiB
SETTINGS_2_14 = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                 "expandable_segments": False, "roundup_power2_divisions": {}, "max_cached_size": -1}


def _block(addr: int, size: int, allocated: bool) -> dict:
    return {"address": addr, "size": size, "requested_size": size if allocated else 0,
            "state": "active_allocated" if allocated else "inactive"}


def _segment(addr: int, size: int, used: int = 0) -> dict:
    blocks = [_block(addr, used, True), _block(addr + used, size - used, False)] if used else [_block(addr, size, False)]
    return {"device": 0, "address": addr, "total_size": size, "allocated_size": used, "active_size": used,
            "requested_size": used, "stream": 0, "segment_type": "large", "blocks": blocks}


def _snapshot(tmp_path, sizes: tuple[int, int], served: int, settings: dict | None = SETTINGS_2_14) -> str:
    """Two start segments of `sizes` at LOW and HIGH; the trace allocates 30 MiB at `served`, then 2 MiB more."""
    segments = [_segment(LOW, sizes[0], 30 * MiB if served == LOW else 0),
                _segment(HIGH, sizes[1], 30 * MiB if served == HIGH else 0)]
    top = served + 30 * MiB
    for seg in segments:
        if seg["address"] == served:  # the 2 MiB after the 30 MiB, split from the same block
            seg["blocks"] = [_block(served, 30 * MiB, True), _block(top, 2 * MiB, True),
                             _block(top + 2 * MiB, seg["total_size"] - 32 * MiB, False)]
            seg["allocated_size"] = seg["active_size"] = seg["requested_size"] = 32 * MiB
    trace = [{"action": "alloc", "addr": served, "size": 30 * MiB, "stream": 0, "time_us": 1, "frames": []},
             {"action": "alloc", "addr": top, "size": 2 * MiB, "stream": 0, "time_us": 2, "frames": []}]
    snap = {"segments": segments, "device_traces": [trace]}
    if settings is not None:
        snap["allocator_settings"] = settings
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    return str(path)


def test_a_tie_between_start_segments_is_named_at_its_entry(tmp_path):
    # PyTorch served the higher segment (it was the older); the replay can only take the lower.
    result = sim.replay(_snapshot(tmp_path, (40 * MiB, 40 * MiB), HIGH), "1GiB")
    assert result.start_age_guesses == 1 and result.start_age_guess_entry == 0
    assert any(n.startswith("entry 0: equal free blocks lay in two segments made before recording began")
               for n in result.notes), result.notes
    assert result.to_json()["start_age_guess_entry"] == 0
    assert not result.exact  # the guess went the other way: the replay says where, and is not exact


def test_no_tie_no_guess(tmp_path):
    # Best fit decides between blocks of different sizes: the 40 MiB one, whatever the segments' ages.
    result = sim.replay(_snapshot(tmp_path, (40 * MiB, 60 * MiB), LOW), "1GiB")
    assert result.exact and result.start_age_guesses == 0 and result.start_age_guess_entry is None
    assert not any("equal free blocks" in n for n in result.notes)


def test_before_torch_2_13_ties_go_by_address_and_need_no_guess(tmp_path):
    # No max_cached_size in the settings: torch 2.11 and earlier, whose ties go to the lower address.
    settings = {k: v for k, v in SETTINGS_2_14.items() if k != "max_cached_size"}
    result = sim.replay(_snapshot(tmp_path, (40 * MiB, 40 * MiB), LOW, settings), "1GiB")
    assert result.exact and result.start_age_guesses == 0


def test_advise_marks_the_rows_that_rest_on_the_guess(tmp_path):
    path = _snapshot(tmp_path, (40 * MiB, 40 * MiB), HIGH)
    guessed = search(path, "reuse_order:segment", capacity="1GiB")
    assert guessed.guessed_at == 0 and "[guess]" in guessed.summary()
    assert guessed.to_json()["guessed_at"] == 0
    assert any("[guess]" in line and "entry 0" in line for line in verdict([guessed]))
    free_of_it = search(_snapshot(tmp_path, (40 * MiB, 60 * MiB), LOW), "reuse_order:segment", capacity="1GiB")
    assert free_of_it.guessed_at is None and "[guess]" not in free_of_it.summary()
