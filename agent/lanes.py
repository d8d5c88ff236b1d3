"""The session's evaluation lanes: one evaluator per GPU (local or on a cluster), each used by one caller at a time.

An evaluation borrows a free lane and gives it back; a candidate, its comparison with the best and its
confirmation all run on the lane it borrowed, so no judgement mixes two GPUs. A lane's GPU is named by
its UUID when the worker reports one, else by the lane's own name.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.traces.results import DeviceInfo, EvalResult


@dataclass
class Lane:
    name: str
    ev: object   # sandbox.pool.Evaluator, sandbox.cluster.RayEvaluator, or a test's stand-in
    infra_streak: int = 0    # evaluations in a row that failed on our side
    retired: bool = False    # takes no more evaluations (it kept failing on our side)

    def gpu(self, res: EvalResult | None = None) -> str:
        """The GPU a result of this lane was timed on: its UUID, else the lane's name."""
        device = (res.device if res is not None else None) or getattr(self.ev, "device", None)
        return device.uuid if device is not None and getattr(device, "uuid", "") else self.name


class Lanes:
    def __init__(self, evaluators: list):
        if not evaluators:
            raise ValueError("a session needs at least one evaluator")
        self.all = [Lane(getattr(ev, "name", None) or f"lane{i}", ev) for i, ev in enumerate(evaluators)]
        if len({lane.name for lane in self.all}) < len(self.all):
            self.all = [Lane(f"{lane.name}-{i}", lane.ev) for i, lane in enumerate(self.all)]
        self._free: queue.Queue[Lane] = queue.Queue()
        for lane in self.all:
            self._free.put(lane)

    def __len__(self) -> int:
        return len(self.all)

    @property
    def first(self):
        return self.all[0].ev

    def start(self, limit: float | None = None) -> list[DeviceInfo]:
        """Start every lane's worker at once (a worker takes seconds to load its model), each within `limit` s when
        given. On the first failure (or an interrupt) the other starts are aborted and the failure raised,
        without waiting for them to load."""
        if len(self.all) == 1:
            return [self.first.start(limit)]
        pool = ThreadPoolExecutor(len(self.all), thread_name_prefix="lane-start")
        futures = [pool.submit(lane.ev.start, limit) for lane in self.all]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:   # raised now, not after the lanes still loading
                raise failed.exception()
            return [f.result() for f in futures]
        except BaseException:
            self.abort()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    @contextmanager
    def borrow(self) -> Iterator[Lane]:
        """A free lane for the caller alone until the block ends (waits while every lane is busy)."""
        while True:
            try:
                lane = self._free.get(timeout=0.5)   # a short wait, so that a signal reaches the main thread
                break
            except queue.Empty:
                continue
        try:
            yield lane
        finally:
            if not lane.retired:
                self._free.put(lane)

    def retire(self, lane: Lane) -> bool:
        """Take `lane` out of service once it is given back, unless it is the last one working; True if retired."""
        if lane.retired or sum(not x.retired for x in self.all) <= 1:
            return False
        lane.retired = True
        return True

    def prebuild(self, candidates: list[Candidate]) -> None:
        for lane in self.all:
            if not lane.retired:
                lane.ev.prebuild(candidates)

    def abort(self) -> None:
        """Kill every lane's running evaluation (the session is stopping)."""
        for lane in self.all:
            abort = getattr(lane.ev, "abort", None)
            if abort is not None:
                abort()

    def close(self) -> None:
        """Close every lane, each whatever happened to the others."""
        errors = []
        for lane in self.all:
            try:
                lane.ev.close()
            except Exception as e:  # noqa: BLE001 - closing the others matters more; the first is raised after
                errors.append(e)
        if errors:
            raise errors[0]
