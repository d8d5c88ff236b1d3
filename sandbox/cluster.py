"""Evaluators on a Ray cluster: each lane is an actor that holds one GPU and runs a local Evaluator on its node.

The protocol, the timeouts, the worker and its confinement are the local ones (sandbox.pool), one per
actor; only the call crosses hosts. Deadlines travel as seconds left, since monotonic clocks of two hosts
do not compare. An actor that dies mid-evaluation (its node lost, its process killed) is restarted by Ray,
and the evaluation it was running comes back as a retryable infra failure: the session retries it once
on a fresh worker, as it does locally. Ray is optional: `pip install 'megakernel-agent[cluster]'`.
"""

from __future__ import annotations

import time
from pathlib import Path

from tenacity import retry, retry_if_exception, stop_after_delay, wait_fixed

from megakernel_agent.traces.results import DeviceInfo, EvalResult, Failure, FailureClass

from .candidate import Candidate
from .pool import Evaluator

INSTALL = "running on a cluster needs Ray: pip install 'megakernel-agent[cluster]' (or pip install 'ray>=2.9')"
CALL_MARGIN_S = 120.0     # beyond the evaluation's own deadline, how long a call may take before the actor is lost
ACTOR_RESTARTS = 3        # Ray restarts a dead lane actor this often over the session
RESTART_WAIT_S = 120.0    # how long a call waits for its actor to come back from a restart


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

    def start(self, startup_timeout: float | None) -> str:
        return self.ev.start(startup_timeout).model_dump_json()

    def evaluate(self, source: str, knobs: dict[str, int], seconds_left: float | None, options: dict) -> str:
        deadline = None if seconds_left is None else time.monotonic() + seconds_left
        cand = Candidate(source=source, knobs=knobs)
        return self.ev.evaluate(cand, deadline=deadline, **options).model_dump_json()

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
            try:
                raw = ray.get(self.actor.start.remote(startup_timeout),
                              timeout=None if startup_timeout is None else startup_timeout + CALL_MARGIN_S)
            except ray.exceptions.RayError as e:
                raise ClusterError(f"lane {self.name} did not start: {_first_line(e)}") from None
            self.device = DeviceInfo.model_validate_json(raw)
        return self.device

    def evaluate(self, candidate: Candidate, deadline: float | None = None, **options) -> EvalResult:
        ray = _ray()
        try:
            self._ready(ray)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ref = self.actor.evaluate.remote(candidate.source, candidate.knobs, left, options)
            res = EvalResult.model_validate_json(ray.get(ref, timeout=None if left is None else left + CALL_MARGIN_S))
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor, no_restart=False)   # Ray starts it again; its worker group dies with it
            return self._lost(candidate, f"lane {self.name} did not answer in time; its actor was restarted")
        except ray.exceptions.RayError as e:
            return self._lost(candidate, f"lane {self.name}'s actor died during the evaluation: {_first_line(e)}")
        self.device = res.device or self.device
        return res

    def _ready(self, ray) -> None:
        """Wait for the actor to take calls: one coming back from a restart refuses them until its constructor has
        run. Only this probe is repeated, never an evaluation (one lost with its actor is reported)."""
        @retry(retry=retry_if_exception(lambda e: isinstance(e, ray.exceptions.ActorUnavailableError)),
               wait=wait_fixed(1.0), stop=stop_after_delay(RESTART_WAIT_S), reraise=True)
        def ping() -> None:
            ray.get(self.actor.ping.remote(), timeout=RESTART_WAIT_S)
        ping()

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
    """How many lanes the cluster can hold: its total of `resource`."""
    return int(_ray().cluster_resources().get(resource, 0))


def ray_evaluators(task: str, size: str, lanes: int, resource: str = "GPU", build_ahead: int = 0,
                   **options) -> list[RayEvaluator]:
    """`lanes` actors, each holding one unit of `resource` ("GPU", or a custom resource standing for one: a
    test cluster's fake GPUs), each with its own Evaluator; `options` go to every Evaluator."""
    ray = _ray()
    have = cluster_gpus(resource)
    if lanes > have:
        raise ClusterError(f"the cluster has {have} {resource} in all; {lanes} lanes were asked for")
    held = {"num_gpus": 1} if resource == "GPU" else {"num_gpus": 0, "resources": {resource: 1}}
    actor_class = ray.remote(LaneActor).options(num_cpus=0, max_concurrency=4, max_restarts=ACTOR_RESTARTS, **held)
    return [RayEvaluator(actor_class.remote(dict(task=task, size=size, build_ahead=build_ahead, name=f"ray{i}",
                                                 **options)), f"ray{i}", task, size) for i in range(lanes)]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
