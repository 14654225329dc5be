"""preflight's RunPlan (torchmem/preflight/run_plan.py): what the launcher tells each process, in one variable."""
import pytest

from torchmem.fakegpu.cards import CARDS
from torchmem.preflight import environment_for
from torchmem.preflight.run_plan import ENV, RunPlan, plan_of


def test_a_plan_reads_back_as_written():
    plan = RunPlan(out="/tmp/run", max_entries=1000, outside=536_870_912, world=64, steps=3, read_weights=True)
    assert plan_of({ENV: plan.to_json()}) == plan
    assert plan_of({}) is None


@pytest.mark.parametrize("text, message", [
    ("not json", "is not JSON"),
    ('{"out": "/tmp/run", "stepz": 3}', "is not a preflight run plan"),
    ('{"steps": 3}', "is not a preflight run plan"),
    ('["/tmp/run"]', "is not a preflight run plan"),
    ('{"out": "/tmp/run", "steps": 0}', "bad steps"),
    ('{"out": "/tmp/run", "outside": -1}', "bad outside"),
    ('{"out": "/tmp/run", "read_weights": "yes"}', "bad read_weights"),
    ('{"out": ""}', "bad out"),
])
def test_a_bad_plan_is_refused_in_one_line(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        plan_of({ENV: text})
    assert "\n" not in str(caught.value)


def test_the_launcher_writes_one_plan_for_the_card_and_options(tmp_path):
    env = environment_for("l4", out=tmp_path, max_entries=500, base={"PATH": "/usr/bin"}, steps=2, world=16)
    plan = plan_of(env)
    assert plan == RunPlan(out=str(tmp_path), max_entries=500, outside=CARDS["l4"].outside_bytes, world=16,
                           steps=2, read_weights=False)
    assert not [k for k in env if k.startswith("TORCHMEM_PREFLIGHT_") and k != ENV]
