"""Hugging Face integration: a TrainerCallback that asks Trainer to save when the policy says so.

Trainer already writes complete checkpoints in its own format (model, optimizer, scheduler,
scaler, every process's RNG state, ``trainer_state.json`` with the step and the data position)
and resumes from them with ``trainer.train(resume_from_checkpoint=True)``, so this callback
only decides *when*: after each optimizer step it compares the step with the adaptive
schedule's next due step (an int compare) and sets ``control.should_save``; Trainer then
writes ``checkpoint-<step>/`` and calls ``on_save``, where the time since ``on_step_end`` is
recorded as the save's cost — that includes any logging or evaluation Trainer ran at the same
step, so keep evaluation off the save steps or accept a slightly pessimistic cost. Saves that
Trainer makes on its own (an ``epoch`` or ``best`` save strategy) count as saves too: the
interval restarts from them. A resumed Trainer continues the schedule from the estimates that
the run log in ``output_dir`` holds for its checkpoint's step, without a new probe.

Use ``save_strategy="no"`` so the adaptive schedule is the only one (with ``"steps"`` Trainer
also saves every ``save_steps``). Retention stays Trainer's: ``save_total_limit`` deletes the
oldest ``checkpoint-*`` folders by step (keeping the best model's when
``load_best_model_at_end``), which suits an adaptive interval; the controller's milestone
checkpoints are not available here — copy a folder aside to keep it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

__all__ = ["AdaptiveSaveCallback"]

try:  # transformers is optional: without it this module still imports, the callback does not.
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:  # pragma: no cover - exercised only where transformers is absent
    _TrainerCallback = object


def _backend():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from simulator.controller.distributed import DistributedBackend

        return DistributedBackend()
    from simulator.controller.backend import LocalBackend

    return LocalBackend()


class AdaptiveSaveCallback(_TrainerCallback):
    """Sets ``control.should_save`` at the steps the adaptive checkpoint interval picks.

    The arguments are those of ``AdaptiveCheckpointer``, whose schedule, run log (kept in
    ``args.output_dir``) and failure-rate posterior decide. Under torch.distributed, rank 0's
    decision is broadcast at save time only, so every process sets ``should_save`` at the same
    step and no collective runs on the other steps.
    """

    def __init__(
        self,
        *,
        policy=None,
        mtbf_h: float | None = None,
        scenario=None,
        restart_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        probe_steps: int = 20,
    ):
        if _TrainerCallback is object:
            raise ImportError("AdaptiveSaveCallback needs transformers (pip install 'ckptsim[hf]')")
        self.clock = clock
        self._options = dict(
            policy=policy,
            mtbf_h=mtbf_h,
            scenario=scenario,
            restart_s=restart_s,
            clock=clock,
            probe_steps=probe_steps,
        )
        self.checkpointer = None
        """The AdaptiveCheckpointer whose schedule decides (set when training begins)."""
        self.schedule = None
        self.requested_steps: list[int] = []
        """Steps at which this callback set ``should_save``."""
        self.saved_steps: list[int] = []
        """Steps at which Trainer reported a save (``on_save``)."""
        self.save_costs_s: list[float] = []
        """Measured cost of each of those saves, seconds."""
        self._step_end_t: float | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from simulator.controller.checkpointer import AdaptiveCheckpointer
        from simulator.controller.external import ExternalSaveSchedule

        strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
        if strategy not in ("no", "best"):
            warnings.warn(
                f"save_strategy={strategy!r} saves on its own schedule as well as the adaptive "
                "one; use save_strategy='no' to let the adaptive interval decide",
                stacklevel=2,
            )
        self.checkpointer = AdaptiveCheckpointer(
            args.output_dir, model=model, backend=_backend(), **self._options
        )
        self.schedule = ExternalSaveSchedule(self.checkpointer)
        self.schedule.start(state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._step_end_t = self.clock()
        if self.schedule.is_due(state.global_step):
            control.should_save = True
            self.requested_steps.append(state.global_step)
        return control

    def on_save(self, args, state, control, **kwargs):
        now = self.clock()
        stall_s = 0.0 if self._step_end_t is None else max(now - self._step_end_t, 0.0)
        self.saved_steps.append(state.global_step)
        self.save_costs_s.append(stall_s)
        self.schedule.record_save(state.global_step, stall_s=stall_s)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.checkpointer is not None:
            self.checkpointer.close()
        return control
