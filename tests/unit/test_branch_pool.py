"""The branch pool's growth rule: it grows when its runners' CPU says the event loops are the bottleneck
(or every runner is full), never merely because many branches wait on the model."""

from __future__ import annotations

import pytest

from reasonray.actors import fanout
from reasonray.actors.fanout import BranchPool, CpuMeter, LLMSpec
from reasonray.kernel.config import FanoutSettings


class Pool(BranchPool):
    """A BranchPool whose runners are placeholders: the rule under test, without starting Ray actors."""

    def _add(self) -> None:
        self.runners.append(object())
        self.load.append(0)
        self.cpu.append(0.0)


def pool(**settings: object) -> Pool:
    p = Pool("t", LLMSpec("{}", "t"), FanoutSettings(**settings))
    for _ in range(p.settings.pool_size):
        p._add()
    return p


def test_many_branches_waiting_on_the_model_do_not_grow_the_pool():
    p = pool(pool_size=2, max_pool_size=8)
    for _ in range(320):  # self_consistency x5 at 64 concurrent, runners idle on the CPU
        p.pick()
    assert len(p.runners) == 2
    assert p.load == [160, 160]


def test_busy_runners_grow_the_pool_one_at_a_time(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(fanout.time, "monotonic", lambda: clock[0])
    p = pool(pool_size=2, max_pool_size=4, grow_at_cpu=0.8)
    p.pick(), p.pick()
    p.reported(0, 0.9)
    p.reported(1, 0.5)
    p.pick()
    assert len(p.runners) == 2, "one runner still has CPU to spare"
    p.reported(1, 0.85)
    assert p.pick() == 2 and len(p.runners) == 3, "every runner busy: a new one takes the branch"
    p.cpu[2] = 0.95
    p.pick()
    assert len(p.runners) == 3, "at most one growth every GROW_EVERY_S"
    clock[0] += fanout.GROW_EVERY_S
    p.pick()
    assert len(p.runners) == 4
    clock[0] += fanout.GROW_EVERY_S
    p.cpu[3] = 0.99
    p.pick()
    assert len(p.runners) == 4, "never past max_pool_size"


def test_full_runners_grow_the_pool_whatever_their_cpu():
    p = pool(pool_size=1, max_pool_size=2, branches_per_runner=3)
    for _ in range(3):
        p.pick()
    assert p.pick() == 1 and len(p.runners) == 2


def test_admission_is_bounded():
    p = pool(max_in_flight=4)
    p.admit(3)
    with pytest.raises(fanout.OverloadedError) as refused:
        p.admit(2)
    assert refused.value.data["max_in_flight"] == 4
    p.release(3)
    p.admit(4)


def test_the_cpu_meter_reports_a_share_of_a_core(monkeypatch):
    wall, cpu = [0.0], [0.0]
    monkeypatch.setattr(fanout.time, "monotonic", lambda: wall[0])
    monkeypatch.setattr(fanout.time, "process_time", lambda: cpu[0])
    meter = CpuMeter(window_s=1.0)
    wall[0], cpu[0] = 0.5, 0.4
    assert meter.read() == 0.0, "less than a window: the last share"
    wall[0], cpu[0] = 2.0, 1.5
    assert meter.read() == pytest.approx(0.75)
