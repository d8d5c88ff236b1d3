"""Evaluators on a Ray cluster: each lane is an actor that holds one GPU and runs a local Evaluator on its node.

The protocol, the timeouts, the worker and its confinement are the local ones (sandbox.pool), one per
actor; only the call crosses hosts. Deadlines travel as seconds left, since monotonic clocks of two hosts
do not compare. An actor that dies mid-evaluation (its node lost, its process killed) is restarted by Ray,
and the evaluation it was running comes back as a retryable infra failure: the session retries it once
on a fresh worker, as it does locally. Ray is optional: `pip install 'megakernel-agent[cluster]'`.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from tenacity import retry, retry_if_exception, stop_after_delay, wait_fixed

from megakernel_agent.traces.results import DeviceInfo, EvalResult, Failure, FailureClass

from .candidate import Candidate
from .pool import Evaluator

INSTALL = "running on a cluster needs Ray: pip install 'megakernel-agent[cluster]' (or pip install 'ray>=2.9')"
CALL_MARGIN_S = 30.0      # beyond the evaluation's own deadline, how long a call may take before the actor is lost
ACTOR_RESTARTS = 3        # Ray restarts a dead lane actor this often over the session
RESTART_WAIT_S = 120.0    # how long a call waits for its actor to come back from a restart (within its deadline)
SETTLE_S = 1.0            # after a worker died: time for its actor's own death, if that was the cause, to show
FREE_WAIT_S = 10.0        # how long to wait for enough free GPUs before refusing
START_WAIT_S = 300.0      # how long a lane may take to be placed and load its worker, when no limit is given


class ClusterError(RuntimeError):
    """Ray is missing, the cluster cannot be reached, or it has fewer GPUs than asked for."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(INSTALL) from None
    return ray


class LaneActor:
    """The actor's side: a local Evaluator on the node Ray placed it on (CUDA_VISIBLE_DEVICES set by Ray)."""

    def __init__(self, options: dict):
        self.ev = Evaluator(**options)
        self.incarnation = uuid.uuid4().hex   # a restarted actor is another incarnation

    def whoami(self) -> str:
        return self.incarnation

    def start(self, startup_timeout: float | None) -> str:
        return self.ev.start(startup_timeout).model_dump_json()

    def evaluate(self, source: str, knobs: dict[str, int], seconds_left: float | None, options: dict
                 ) -> tuple[str, str]:
        """(this incarnation, the result as JSON)."""
        deadline = None if seconds_left is None else time.monotonic() + seconds_left
        cand = Candidate(source=source, knobs=knobs)
        return self.incarnation, self.ev.evaluate(cand, deadline=deadline, **options).model_dump_json()

    def ping(self) -> bool:
        return True

    def prebuild(self, candidates: list[tuple[str, dict[str, int]]]) -> None:
        self.ev.prebuild([Candidate(source=s, knobs=k) for s, k in candidates])

    def abort(self) -> None:
        self.ev.abort()

    def close(self) -> None:
        self.ev.close()


class RayEvaluator:
    """The session's side of one lane actor, with the Evaluator's interface."""

    def __init__(self, actor, name: str, task: str, size: str):
        self.actor, self.name, self.task, self.size = actor, name, task, size
        self.device: DeviceInfo | None = None
        self.work_dir: Path | None = None   # the worker's logs stay on the actor's node

    def start(self, startup_timeout: float | None = None) -> DeviceInfo:
        ray = _ray()
        if self.device is None:
            limit = START_WAIT_S if startup_timeout is None else min(START_WAIT_S, startup_timeout + CALL_MARGIN_S)
            try:   # an actor that cannot be placed (its GPU held by another job) never starts: bounded here
                raw = ray.get(self.actor.start.remote(startup_timeout), timeout=limit)
            except ray.exceptions.GetTimeoutError:
                raise ClusterError(f"lane {self.name} did not start within {limit:.0f} s (is a GPU free for it?)") \
                    from None
            except ray.exceptions.RayError as e:
                raise ClusterError(f"lane {self.name} did not start: {_first_line(e)}") from None
            self.device = DeviceInfo.model_validate_json(raw)
        return self.device

    def evaluate(self, candidate: Candidate, deadline: float | None = None, **options) -> EvalResult:
        ray = _ray()
        try:
            self._ready(ray, deadline)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ref = self.actor.evaluate.remote(candidate.source, candidate.knobs, left, options)
            incarnation, raw = ray.get(ref, timeout=None if left is None else left + CALL_MARGIN_S)
            res = EvalResult.model_validate_json(raw)
            if res.failure is not None and res.failure.cls in (FailureClass.crash, FailureClass.timeout) \
                    and not self._same_actor(ray, incarnation):
                return self._lost(candidate, f"lane {self.name}'s actor died while its worker was evaluating (the "
                                             f"worker's {res.failure.cls.value} was the actor's death, not the "
                                             "candidate's)")
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor, no_restart=False)   # Ray starts it again; its worker group dies with it
            return self._lost(candidate, f"lane {self.name} did not answer in time; its actor was restarted")
        except ray.exceptions.RayError as e:
            return self._lost(candidate, f"lane {self.name}'s actor died during the evaluation: {_first_line(e)}")
        self.device = res.device or self.device
        return res

    def _ready(self, ray, deadline: float | None) -> None:
        """Wait for the actor to take calls: one coming back from a restart refuses them until its constructor has
        run. Only this probe is repeated, never an evaluation (one lost with its actor is reported). The wait
        ends by the caller's deadline."""
        limit = RESTART_WAIT_S if deadline is None else max(1.0, min(RESTART_WAIT_S, deadline - time.monotonic()))

        @retry(retry=retry_if_exception(lambda e: isinstance(e, ray.exceptions.ActorUnavailableError)),
               wait=wait_fixed(1.0), stop=stop_after_delay(limit), reraise=True)
        def ping() -> None:
            ray.get(self.actor.ping.remote(), timeout=limit)
        ping()

    def _same_actor(self, ray, incarnation: str) -> bool:
        """Whether the actor that reported a dead worker is still alive as the same incarnation: when Ray kills an
        actor (or loses its node) its worker may die first, and the actor report that as the candidate's crash."""
        time.sleep(SETTLE_S)
        try:
            return ray.get(self.actor.whoami.remote(), timeout=30) == incarnation
        except ray.exceptions.RayError:
            return False

    def _lost(self, candidate: Candidate, message: str) -> EvalResult:
        failure = Failure(cls=FailureClass.infra, phase="cluster", message=message, retryable=True)
        return EvalResult(task=self.task, size=self.size, key="", knobs=candidate.knobs, device=self.device,
                          failure=failure)

    def prebuild(self, candidates: list[Candidate]) -> None:
        """Fire and forget: the actor compiles on its node's cores while it is not evaluating."""
        self.actor.prebuild.remote([(c.source, c.knobs) for c in candidates])

    def abort(self) -> None:
        self.actor.abort.remote()

    def close(self) -> None:
        ray = _ray()
        try:
            ray.get(self.actor.close.remote(), timeout=30)
        except ray.exceptions.RayError:
            pass
        finally:
            ray.kill(self.actor, no_restart=True)


def connect(address: str) -> None:
    """Join the cluster at `address`: "auto" (the cluster started on this host by `ray start --head`), a
    "ray://HOST:PORT" client address, or "local" (start a one-host cluster in this process)."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address!r}: {_first_line(e)}") from None


def disconnect() -> None:
    """Leave the cluster (a "local" one stops with it); the lane actors were closed before."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


def cluster_gpus(resource: str = "GPU") -> int:
    """How many lanes the cluster can hold now: its free units of `resource` (other jobs may hold some)."""
    ray = _ray()
    if not ray.is_initialized():
        raise ClusterError("not connected to a Ray cluster (sandbox.cluster.connect first)")
    return int(ray.available_resources().get(resource, 0))


def ray_evaluators(task: str, size: str, lanes: int, resource: str = "GPU", build_ahead: int = 0,
                   **options) -> list[RayEvaluator]:
    """`lanes` actors, each holding one unit of `resource` ("GPU", or a custom resource standing for one: a
    test cluster's fake GPUs), each with its own Evaluator; `options` go to every Evaluator."""
    ray = _ray()
    end = time.monotonic() + FREE_WAIT_S
    while (have := cluster_gpus(resource)) < lanes and time.monotonic() < end:
        time.sleep(0.2)   # lanes of a job that just ended give their GPUs back asynchronously
    if lanes < 1 or lanes > have:
        raise ClusterError(f"the cluster has {have} {resource} free; {lanes} lanes were asked for")
    held = {"num_gpus": 1} if resource == "GPU" else {"num_gpus": 0, "resources": {resource: 1}}
    actor_class = ray.remote(LaneActor).options(num_cpus=0, max_concurrency=4, max_restarts=ACTOR_RESTARTS, **held)
    return [RayEvaluator(actor_class.remote(dict(task=task, size=size, build_ahead=build_ahead, name=f"ray{i}",
                                                 **options)), f"ray{i}", task, size) for i in range(lanes)]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
