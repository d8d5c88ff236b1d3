"""GPU worker process: keeps the task's models warm and evaluates candidates on request.

Started by sandbox.pool in its own process group. Protocol: requests on stdin, messages on the
original stdout (fd 1 is redirected to stderr so that nothing else can corrupt the protocol).
After any CUDA error the worker answers and exits: a retired process cannot hand a broken context to the
next candidate. After a wrong answer it stays only when its context still works and every weight is bit
for bit the copy taken at start-up (sandbox.integrity); a respawn costs ~20 s of loading weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from .integrity import WeightGuard

if TYPE_CHECKING:
    from megakernel_agent.traces.results import Failure, PhaseTimeline

PROTOCOL_OUT = None


def send(obj: dict) -> None:
    PROTOCOL_OUT.write(json.dumps(obj) + "\n")
    PROTOCOL_OUT.flush()


def unexpected_failure(e: Exception, phase: str, context_healthy: bool) -> dict:
    """Class and retryability of an exception an evaluation did not expect: a CUDA error or a broken context is
    the candidate's crash; a module load out of memory (the worker's state: every build it holds) and anything
    else is our side's, retried on a fresh worker."""
    from megakernel_agent.tasks.cuda_runtime import CudaOutOfMemory
    from megakernel_agent.traces.results import FailureClass

    short = isinstance(e, CudaOutOfMemory) and phase == "build" and context_healthy
    cuda_broken = not short and (not context_healthy or "CUDA" in str(e) or "cuda" in type(e).__module__)
    return {"cls": FailureClass.crash if cuda_broken else FailureClass.infra, "phase": phase,
            "retryable": not cuda_broken}


class Worker:
    def __init__(self, task_name: str, size: str, weight_seed: int, builds: Path | None = None):
        import torch

        from megakernel_agent.tasks.registry import get_task

        from .device import device_info

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is visible to this process")
        self.torch = torch
        self.device = torch.device("cuda:0")
        torch.cuda.set_device(self.device)
        self.task = get_task(task_name, size)
        self.info = device_info(self.device)
        major, minor = torch.cuda.get_device_capability(self.device)
        self.arch = f"sm_{major}{minor}"
        self.reference = self.task.build_reference(self.device, weight_seed)
        self.baseline = self.task.build_baseline(self.reference)
        self.guard = WeightGuard(self.reference)
        self.models: dict = {}   # "candidate": checked and timed; "stamped": its -DPHASE_STAMPS=1 build, profiled
        self.kernels: dict = {}
        self.builds = builds   # where the session's builds made ahead lie (sandbox.build_ahead)
        self.baseline_us: dict[int, list[float]] = {}

    def _model(self, role: str, kernel):
        """The worker's `role` model, running `kernel` from its next step (each role keeps its own weights)."""
        if role in self.models:
            return self.models[role].attach(kernel)
        self.models[role] = self.task.build_candidate(self.reference, kernel)
        return self.models[role]

    def evaluate(self, req) -> tuple[dict, bool]:
        """(EvalResult as dict, retire?). After a candidate ran, the worker's weights must be intact (also
        when its profile failed after its checks and timing, or its answers were wrong), and after a wrong
        answer its CUDA context must still work."""
        from megakernel_agent.traces.results import Failure, FailureClass

        result, retire = self._evaluate(req)
        failure = result.get("failure") or {}
        if failure.get("cls") == FailureClass.wrong.value and not self._context_healthy():
            retire = True
        if self.models and not retire:
            try:
                changed = self.guard.changed(reference=self.reference,
                                             **{f"{role}_model": m for role, m in self.models.items()})
            except Exception as e:  # noqa: BLE001 - our check broke, not the candidate: retried on a fresh worker
                sys.stderr.write(traceback.format_exc())
                why = f"the weight check itself failed ({type(e).__name__}: {e}); worker retired"
                result["failure"] = Failure(cls=FailureClass.infra, phase="integrity", message=why[:2000],
                                            retryable=True).model_dump()
                return result, True
            if changed:
                why = f"the candidate wrote into memory it does not own: weights {changed[:4]} changed"
                result["failure"] = Failure(cls=FailureClass.wrong, phase="integrity", message=why).model_dump()
                retire = True
            retire = retire or self.guard.remaining == 0   # its last key is spent: the next candidate needs a new one
        return result, retire

    def _evaluate(self, req) -> tuple[dict, bool]:
        from megakernel_agent.tasks.cuda_runtime import KernelContractError
        from megakernel_agent.traces.results import EvalResult, Failure, FailureClass

        from .build import build_for_device, build_key
        from .candidate import Candidate, CandidateError
        from .checks import Checker
        from .profile import count_launches
        from .timing import time_candidate, time_steps, timing_result

        cand = Candidate(source=req.source, knobs=req.knobs)
        spec = self.task.spec
        try:
            key = build_key(self.task, cand, self.info)
        except CandidateError as e:
            res = EvalResult(task=spec.name, size=spec.size, key="", failure=Failure(
                cls=FailureClass.build, phase="build", message=str(e)), device=self.info, worker_pid=os.getpid())
            return res.model_dump(), False
        res = EvalResult(task=spec.name, size=spec.size, key=key, device=self.info, worker_pid=os.getpid())
        phase = "build"
        t0 = time.perf_counter()

        def enter(name: str) -> None:
            nonlocal phase, t0
            res.phase_seconds[phase] = res.phase_seconds.get(phase, 0.0) + time.perf_counter() - t0
            phase, t0 = name, time.perf_counter()
            send({"event": "phase", "phase": name})

        send({"event": "phase", "phase": "build"})
        try:
            build, kernel = build_for_device(self.task, cand, self.arch, key, self.kernels, ahead=self.builds)
            res.build, res.knobs = build, build.knobs
            if not build.ok:
                res.failure = Failure(cls=FailureClass.build, phase="build", message=build.error)
                return res.model_dump(), False
            res.placement = f"{os.getpid()}:{key[:16]}:{build.load}"
            enter("check")
            try:
                model = self._model("candidate", kernel)
                hidden, state = self.task.make_inputs(spec.fixed_seeds[0], spec.check_context_lengths[0], self.device)
                model.step(hidden, state)  # first launch: packs arguments, checks co-residency
                self.torch.cuda.synchronize()
            except KernelContractError as e:   # its launch shape, ABI or layout declaration cannot be honoured
                res.failure = Failure(cls=FailureClass.build, phase="launch", message=str(e))
                return res.model_dump(), False
            checker = Checker(self.task, self.reference, model, self.device)
            if req.check:
                res.check = checker.run(req.fresh_seeds)
                if not res.check.passed:
                    res.failure = Failure(cls=FailureClass.wrong, phase="check", message=res.check.first_failure)
                    return res.model_dump(), False
                enter("launches")
                ctx = spec.check_context_lengths[0]
                hidden, state = self.task.make_inputs(spec.fixed_seeds[0], ctx, self.device)
                res.launches = count_launches(lambda: model.step(hidden, state), self.device)
                if res.launches.kernels != 1:
                    res.failure = Failure(cls=FailureClass.wrong, phase="launches",
                                          message=f"{res.launches.kernels} kernel launches per step "
                                                  f"({', '.join(res.launches.names)}); exactly 1 is required")
                    return res.model_dump(), False
            if req.time:
                tspec = spec.timing
                contexts = req.contexts or spec.context_lengths
                if req.baseline:
                    enter("baseline")
                    for ctx in contexts:
                        if ctx not in self.baseline_us:
                            self.baseline_us[ctx], _ = time_steps(
                                self.task, self.baseline, ctx, 7, tspec.baseline_steps_per_sample,
                                tspec.baseline_samples, 1, self.device)
                enter("time")
                steps = req.steps_per_sample or tspec.steps_per_sample
                for ctx in contexts:
                    gpu, host, checks = time_candidate(self.task, model, checker, ctx, steps,
                                                       req.samples or tspec.samples, tspec.warmup_steps, self.device)
                    res.timings.append(timing_result(self.task, ctx, steps, gpu, host, self.info.copy_tbs,
                                                     self.baseline_us.get(ctx) if req.baseline else None, checks))
                    bad = next((c for c in checks if not c.passed), None)
                    if bad is not None:
                        res.failure = Failure(cls=FailureClass.wrong, phase="time",
                                              message=f"timed sample at ctx {ctx} (seed {bad.seed}, step "
                                                      f"{bad.verified_step} checked): {bad.message}")
                        return res.model_dump(), False
            if req.profile:
                enter("profile")
                res.phases, res.failure = self._profile(cand, key, req.profile)
                if res.failure is not None:
                    return res.model_dump(), False
            enter("done")
            return res.model_dump(), False
        except Exception as e:  # noqa: BLE001 - classified below; the parent gets a result, never a hang
            detail = f"{type(e).__name__}: {e}"
            res.failure = Failure(**unexpected_failure(e, phase, self._context_healthy()), message=detail[:2000])
            sys.stderr.write(traceback.format_exc())
            return res.model_dump(), True
        finally:
            res.phase_seconds[phase] = res.phase_seconds.get(phase, 0.0) + time.perf_counter() - t0

    def _profile(self, cand, key: str, contexts: list[int]) -> tuple[list[PhaseTimeline], Failure | None]:
        """(phase timelines at `contexts`, None), from the candidate's stamped build on a model of its own; or
        ([], the Failure) when the task declares no phases or the build or its stamps do not fit them."""
        from megakernel_agent.traces.results import Failure, FailureClass

        from .build import build_for_device
        from .phases import STAMPED_BUILD, PhaseStampError
        from .profile import profile_phases

        def failed(message: str) -> tuple[list, Failure]:
            return [], Failure(cls=FailureClass.build, phase="profile", message=message)

        if not self.task.phase_names():
            return failed(f"task {self.task.spec.name}'s kernels declare no phases: there is nothing to profile")
        build, kernel = build_for_device(self.task, cand, self.arch, key, self.kernels,
                                         instruments=STAMPED_BUILD)
        if not build.ok:
            return failed(f"the stamped build (-DPHASE_STAMPS=1) failed: {build.error}")
        model = self._model("stamped", kernel)
        try:
            return [profile_phases(self.task, model, ctx, build.resources.grid, self.device) for ctx in contexts], None
        except PhaseStampError as e:
            return failed(str(e))

    def _context_healthy(self) -> bool:
        try:
            self.torch.cuda.synchronize()
            self.torch.zeros(1, device=self.device).add_(1).item()
            return True
        except Exception:  # noqa: BLE001
            return False


def main() -> None:
    global PROTOCOL_OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", required=True)
    ap.add_argument("--size", default="full")
    ap.add_argument("--weight-seed", type=int, default=0)
    ap.add_argument("--builds", type=Path, default=None, help="the folder of builds made ahead")
    args = ap.parse_args()
    PROTOCOL_OUT = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (compilers, libraries) go to the log, not the protocol
    sys.stdout = sys.stderr
    try:
        worker = Worker(args.task, args.size, args.weight_seed, args.builds)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        send({"event": "fatal", "message": f"{type(e).__name__}: {e}"})
        return
    send({"event": "ready", "pid": os.getpid(), "device": worker.info.model_dump()})
    from .protocol import EvalRequest

    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("op") == "shutdown":
            break
        result, retire = worker.evaluate(EvalRequest.model_validate(msg["request"]))
        send({"event": "result", "result": result, "retire": retire})
        if retire:
            break


if __name__ == "__main__":
    main()
