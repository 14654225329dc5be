"""planned() on ordinary training loops: the README's loop and three other
common shapes each settle into "planned" within 3 steps and stay there for
100 steps. Allocations that outlive every step in the same way (the returned
loss, the gradients kept until the next zero_grad) are part of the plan
(`unplanned`: served by the caching allocator by design), not misses.
Each loop runs in a fresh interpreter."""
import pytest

from tests.support.subprocess_runner import run_python_json

PRELUDE = """
import json, torch, torchmem
torch.manual_seed(0)
torchmem.install()
# Seven allocations outlive each step (six gradients and the loss) of 26: more than planned()'s default
# max_miss_ratio of 0.25, so counting them as misses would drop the plan at every step.
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [torch.randn(32, 64) for _ in range(103)]
reports = []
def note(report):
    reports.append([report.phase, report.hits, report.misses, report.unplanned, report.rerecord])
"""

# README.md's train_step ("Planned allocation"): zero_grad() first, the loss returned and kept. The
# README's blocks that call it run with this one too (tests/package/test_docs_code.py).
TRAIN_STEP = """
def train_step(batch):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss
"""

LOOPS = {
    # README.md, "Planned allocation": TRAIN_STEP, planned step by step
    "readme": TRAIN_STEP + """
for i, batch in enumerate(loader):
    with torchmem.planned(inputs=batch) as report:
        loss = train_step(batch)
    note(report)
""",
    # loss.item() logged after the block; the loss tensor lives until the next step replaces it
    "item_logging": """
total = 0.0
for batch in loader:
    with torchmem.planned(inputs=batch) as report:
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
    total += loss.item()
    note(report)
""",
    # gradient accumulation: one planned block per optimizer step, four micro-batches in it
    "grad_accumulation": """
for batch in loader:
    with torchmem.planned(inputs=batch) as report:
        optimizer.zero_grad()
        for micro in batch.chunk(4):
            (model(micro).pow(2).mean() / 4).backward()
        optimizer.step()
    note(report)
""",
    # zero_grad(set_to_none=False): the gradients are made once and zeroed in place
    "set_to_none_false": """
def train_step(batch):
    optimizer.zero_grad(set_to_none=False)
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss
for batch in loader:
    with torchmem.planned(inputs=batch) as report:
        loss = train_step(batch)
    note(report)
""",
}

EPILOGUE = """
torchmem.caching_allocator().check_invariants()
print(json.dumps({"reports": reports, "region": torchmem.planned.slab_stats()["region_bytes"]}))
"""


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_loop_settles_into_planned_within_3_steps_and_stays_for_100(loop):
    r = run_python_json(PRELUDE + LOOPS[loop] + EPILOGUE)
    reports = r["reports"]
    assert len(reports) == 103
    assert [p[0] for p in reports[:2]] == ["warmup", "recorded"]
    for i, (phase, hits, misses, unplanned, rerecord) in enumerate(reports[2:], 2):
        assert (phase, misses, rerecord) == ("planned", 0, False), (loop, i, reports[i])
        assert hits > 0
    assert r["region"] > 0


def test_the_readme_loop_plans_for_what_outlives_the_step():
    """The returned loss and the gradients outlive each step: they are
    unplanned slots of the plan, the same ones every step, never misses."""
    r = run_python_json(PRELUDE + LOOPS["readme"] + EPILOGUE)
    planned_steps = r["reports"][2:]
    counts = {(p[1], p[3]) for p in planned_steps}
    assert len(counts) == 1  # the same every step
    hits, unplanned = counts.pop()
    assert unplanned == 7  # three weight and three bias gradients, and the returned loss
    assert unplanned / (hits + unplanned) > 0.25  # as misses, these alone would exceed max_miss_ratio


def test_an_allocation_that_outlives_the_step_differently_still_misses():
    """Only an allocation the plan expects to outlive the step (same place,
    size and stream) is `unplanned`; another size at that place is a miss."""
    r = run_python_json("""
import json, torch, torchmem
torchmem.install()
kept = []
def step(n):
    a = torch.empty(1000)
    kept.append(torch.empty(n))      # outlives the step
    del a
for n in (2000, 2000, 2000, 3000):
    with torchmem.planned("k") as report:
        step(n)
    kept[:-1] = []
print(json.dumps([report.phase, report.hits, report.misses, report.unplanned]))
""")
    phase, hits, misses, unplanned = r
    assert (phase, hits, misses, unplanned) == ("planned", 1, 1, 0)
