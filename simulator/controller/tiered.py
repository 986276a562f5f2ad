"""What :class:`~simulator.controller.checkpointer.AdaptiveCheckpointer` does with a local tier.

The checkpointer's save, restore and preemption paths ask these methods the few questions
that differ with a second tier (:mod:`simulator.controller.local_tier` says what the tier is):
which storage a checkpoint is in, which tiers are due, which tier to restore from and which to
save to when preempted. Without ``local_dir`` every answer is the single-tier one, so that path
runs exactly as it did. Under torch.distributed rank 0's answers (the tiers due, the tier a
preemption saves to) are broadcast, and the local tier is a ring of per-rank snapshots whose
inventory every rank gathers before rank 0 chooses (:mod:`simulator.controller.local_ring`).

Preemption grace. With ``preemption_grace_s`` (the seconds a scheduler allows between its
signal and the kill: SLURM's ``--signal=USR1@90`` gives 90), the save a preemption signal
triggers goes to the persistent tier when its expected time — the measured stall of a
persistent save, plus its background write for an async save — fits in what is left of the
grace period, and to the local tier (with a warning) when it does not or when no persistent
save has been timed yet (none this run, no prior from a scenario). Without a local tier
it is saved to the persistent tier anyway, with a warning that it may not finish. The run log's
``preempted`` record then names the tier and the seconds from the signal to the commit.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

from simulator.controller._warn import user_stacklevel
from simulator.controller.commit import (
    REJECTED,
    choose_checkpoint,
    misnamed,
    reject,
    write_and_commit,
)
from simulator.controller.estimate import FailureRatePosterior
from simulator.controller.integrity import (
    CheckpointWriteError,
    CorruptCheckpoint,
    UnsafeCheckpoint,
)
from simulator.controller.local_ring import Ring
from simulator.controller.local_tier import (
    LocalTier,
    check_local_dir,
    next_generation,
    run_id,
    superseded,
)
from simulator.controller.schedule import DEFAULT_MTBF_S
from simulator.controller.shared_failure import failing_together
from simulator.controller.state import check_state
from simulator.controller.storage import (
    apply_retention,
    checkpoint_name,
    checkpoint_step,
    complete_steps,
    delete_checkpoint,
)
from simulator.controller.tier_schedule import (
    LOCAL,
    PERSISTENT,
    TIERS,
    TieredSchedule,
    check_tier_intervals,
    mtbf_by_class,
    scenario_priors,
)
from simulator.errors import InputError

__all__ = ["TierMixin", "open_local_tier", "tiered_schedule"]

logger = logging.getLogger("simulator.controller")

_SUPERSEDED = f"{REJECTED}superseded"
"""A snapshot a restore refused as of an earlier branch, moved aside (removed at the next one)."""
_UNSEEN_CLASS_SHARE = 0.01
"""A class the scenario gives no rate: a prior of 1 % of the job's rate worth 0.01 failures,
so a single failure of that class moves it at once."""


def tiered_schedule(base: dict, mtbf_h, scenario, fixed) -> TieredSchedule:
    """The two-tier schedule: ``base`` (the single-tier Schedule's arguments) plus a prior per
    failure class and the local tier's stall prior (see :mod:`~.tier_schedule`)."""
    stall = {LOCAL: None, PERSISTENT: base["checkpoint_prior_s"]}
    weight = 2.0
    if mtbf_h is not None:
        mtbf = mtbf_by_class(mtbf_h * 3600.0)
    elif scenario is not None and scenario.has_mtbf:
        priors = scenario_priors(scenario)
        mtbf = priors["mtbf_s"]
        stall = {k: v if v is not None else stall[k] for k, v in priors["stall_s"].items()}
    else:
        mtbf, weight = mtbf_by_class(DEFAULT_MTBF_S), 1.0
    known = [1.0 / v for v in mtbf.values() if v is not None]
    total_rate = sum(known)
    priors = {}
    for k, v in mtbf.items():
        if v is None:
            priors[k] = FailureRatePosterior(
                failures=_UNSEEN_CLASS_SHARE, exposure_s=1.0 / total_rate
            )
        else:
            priors[k] = FailureRatePosterior.from_prior(v, weight)
    base = dict(base, checkpoint_prior_s=stall[PERSISTENT])
    return TieredSchedule(class_priors=priors, local_prior_s=stall[LOCAL], fixed=fixed, **base)


def open_local_tier(ckpt) -> LocalTier:
    """This process's local tier for ``ckpt`` (the run's id read or made in its directory by
    rank 0). Under torch.distributed each rank has its own directory in the ring
    (:mod:`~simulator.controller.local_ring`); the tier is on for every rank or for none."""
    backend = ckpt.backend
    record, why = ckpt._on_rank0(  # its failure raised on every rank, not left in a broadcast
        lambda: run_id(ckpt.storage, ckpt.root, remote=ckpt._remote, create=not ckpt.read_only),
        f"reading the run's id in {ckpt.root}",
    )
    ckpt._run_record = record
    ckpt._generation_settled = False
    rid, generation, branch = record if record is not None else (None, 0, "")
    ring = backend.writes_manifest()
    sub = f"rank-{backend.rank}" if ring else None
    # A rank failing here alone would leave the others in the ring's first all-gather.
    with failing_together(backend, f"opening its local tier in {ckpt._local_dir}"):
        tier = LocalTier(
            ckpt._local_dir,
            rid,
            keep_last=ckpt._local_keep,
            why=why,
            sub=sub,
            generation=generation,
            branch=branch,
        )
    ckpt._ring = None
    if ring:
        # The template, {rank} and all: the ring looks in every rank's directory.
        ckpt._ring = Ring(backend, tier, run_id=rid, local_dir=ckpt._local_template)
        # Whether every rank found its own directory: a restart that lost a host is a node loss.
        tier.found = all(found for found, _ in ckpt._ring.tiers)
        off = [(r, why) for r, (_, why) in enumerate(ckpt._ring.tiers) if why is not None]
        if off:  # gathered: the same on every rank, so every rank takes the collective below
            usable = tier.usable
            if usable:
                tier.disabled = f"rank {off[0][0]}'s local tier is unusable ({off[0][1]})"
            # A filter may make rank 0's warning an error: raised on every rank.
            with failing_together(backend, "warning that the local tier is off"):
                if usable and backend.rank == 0:
                    warnings.warn(
                        f"local tier off for every rank: {tier.disabled}; a snapshot that one "
                        "rank cannot keep restores no rank",
                        stacklevel=3,
                    )
    if not tier.usable:
        ckpt.schedule.local_enabled = False
    ckpt._local_rejected = {}
    ckpt._local_superseded = set()
    ckpt._local_saved = None
    ckpt.local_saves = 0
    ckpt.local_last_saved_step = None
    ckpt.restored_tier = None
    ckpt._last_stalls = {}
    return tier


class TierMixin:
    """The tier questions of the checkpointer (``self.local`` is None without a local tier)."""

    local: LocalTier | None

    # -- options ----------------------------------------------------------------------------
    def _tier_options(self, local_dir, local_keep_last, policy, grace_s) -> dict | None:
        """Check the tier arguments; returns hand-set tier intervals (or None)."""
        from simulator.model.tiers import TierSchedule

        ok = grace_s is None or (
            not isinstance(grace_s, bool)
            and isinstance(grace_s, int | float)
            and math.isfinite(grace_s)
            and grace_s > 0
        )
        if not ok:
            raise InputError(
                f"preemption_grace_s must be a positive number of seconds, got {grace_s!r}"
            )
        self.preemption_grace_s = None if grace_s is None else float(grace_s)
        self._local_dir = None
        self.local = None
        self._ring = None
        if local_dir is None:
            if isinstance(policy, TierSchedule):
                raise InputError(
                    "a TierSchedule policy sets each tier's interval: give local_dir too "
                    "(the local tier), or a single-tier policy"
                )
            if local_keep_last is not None:
                raise InputError("local_keep_last is the local tier's retention: give local_dir")
            return None
        if self.backend.writes_manifest() and not hasattr(self.backend, "write_own"):
            raise InputError(
                f"local_dir needs a backend that writes each rank's own snapshot "
                f"(DistributedBackend); {type(self.backend).__name__} does not: use the "
                "persistent tier alone"
            )
        # {rank} and symlinks resolve differently on each host: a rank refusing its own
        # local_dir alone would leave the others in the first collective.
        with failing_together(self.backend, f"checking local_dir {local_dir}"):
            self._local_dir = check_local_dir(
                local_dir, self.root, remote=self._remote, rank=self.backend.rank
            )
        self._local_template = str(local_dir)
        keep = 2 if self.async_save else 1
        if local_keep_last is not None:
            bad = isinstance(local_keep_last, bool) or not isinstance(local_keep_last, int)
            if bad or local_keep_last < 1:
                raise InputError(
                    f"local_keep_last must be a whole number of checkpoints >= 1, got "
                    f"{local_keep_last!r}"
                )
            keep = max(local_keep_last, 2) if self.async_save else local_keep_last
        self._local_keep = keep
        if policy is None:
            return None
        if isinstance(policy, TierSchedule):
            return check_tier_intervals(policy.intervals_s, policy.every)
        raise InputError(
            "with local_dir the policy is None (the model's tier plan, learned as the run goes) "
            "or simulator.model.tiers.TierSchedule({'local': SECONDS, 'persistent': SECONDS}), "
            f"got {getattr(policy, 'name', type(policy).__name__)!r}"
        )

    def _start_fields(self) -> dict:
        if self.local is None:
            return {}
        return {
            "run_id": self.local.run_id,
            "local_found": self.local.found,
            "local_dir": str(self.local.root),
        }

    # -- saving -----------------------------------------------------------------------------
    def _check_tier(self, tier: str) -> None:
        if tier not in TIERS:
            raise InputError(f"tier must be {LOCAL!r} or {PERSISTENT!r}, got {tier!r}")
        if tier == LOCAL and self.local is None:
            raise InputError("tier='local' needs a local tier: give local_dir")

    def _save_due(self, step: int) -> None:
        if self.local is None:
            self.save(step)
            return
        tiers = self.schedule.tiers_due(step)
        if self.backend.world_size > 1:
            tiers = self.backend.broadcast(tiers)  # rank 0's clock decides, as for the step
        for tier in tiers:
            self.save(step, tier=tier)

    def _add_tier_state(self, state: dict) -> None:
        if self.local is not None:
            state["tiered"] = {
                "run_id": self.local.run_id,
                "generation": self.local.generation,
                "branch": self.local.branch,
                "local_save_stall_s": self.schedule.local_stall.value,
            }

    def _stall_of(self, tier: str):
        return self.schedule.local_stall if tier == LOCAL else self.schedule.stall

    def _count_save(self, tier: str) -> None:
        if tier == LOCAL:
            self.local_saves += 1
        else:
            self.saves += 1

    def _due_after(self, tier: str, step: int, session_s: float) -> int:
        if self.local is None:
            return self.schedule.next_due(step, age_s=session_s)
        return self.schedule.next_due(step, age_s=session_s, tier=tier)

    def _interval_of(self, tier: str) -> float:
        if self.local is None:
            return self.schedule.interval_s
        return self.schedule.tier_interval_s[tier]

    def _tier_field(self, tier: str) -> dict:
        return {} if self.local is None else {"tier": tier}

    def _note_saved(self, tier: str, step: int, stall_s: float) -> None:
        if tier == LOCAL:
            self._local_saved = step
        else:
            self._saved_step = step
        if self.local is not None:
            self._last_stalls = {
                **(self._last_stalls if self._last_stalls.get("step") == step else {}),
                "step": step,
                tier: round(stall_s, 6),
            }

    def _saved_in(self, tier: str) -> int | None:
        return self._local_saved if tier == LOCAL else self._saved_step

    def _write_local(self, step: int, state: dict) -> None:
        local = self.local
        if not local.usable:
            raise CheckpointWriteError(local.disabled)
        if self._ring is not None:
            problem = self._ring.save(step, state)  # raises when a rank's own write failed
            if problem is not None:
                logger.warning("local tier: %s", problem)
                warnings.warn(f"local tier: {problem}", stacklevel=user_stacklevel())
        else:
            write_and_commit(local.dir, local.storage, self.backend, step, state, barriers=False)
        self.local_last_saved_step = step
        if self.backend.rank == 0:  # the line is logged once, by rank 0 (save())
            self._report(step, tier=LOCAL, bytes=self._checkpoint_bytes(step, local.storage))
        try:
            apply_retention(
                local.storage,
                keep_last=local.keep_last,
                resumed_from=self.resumed_from if self.restored_tier == LOCAL else None,
            )
        except OSError as exc:
            warnings.warn(f"local tier retention failed: {exc}", stacklevel=user_stacklevel())

    def _local_failed(self, step: int, exc) -> None:
        message = (
            f"local tier: saving step {step} in {self.local.root} failed ({exc}); the "
            f"persistent tier is unaffected (newest: {self._last_good()}) and training goes on"
        )
        logger.warning("%s", message)
        warnings.warn(message, stacklevel=user_stacklevel())

    # -- restoring --------------------------------------------------------------------------
    def _tier_storage(self, tier: str):
        return self.local.storage if tier == LOCAL else self.storage

    def _newest_persistent(self) -> int | None:
        steps = [
            s
            for s in complete_steps(self.storage)
            if checkpoint_name(s) not in self._rejected and checkpoint_step(checkpoint_name(s))
        ]
        return steps[-1] if steps else None

    def _choose_tiered(self) -> str | None:
        """The newest intact checkpoint across tiers; a local one at least as new as the newest
        persistent one wins (the same state, quicker to read: ``tiers.rollback``'s rule)."""
        local_name = self._choose_local()
        local_step = checkpoint_step(local_name) if local_name is not None else None
        newest = self._newest_persistent()
        if local_step is not None and (newest is None or local_step >= newest):
            self._restore_tier = LOCAL
            return local_name
        name = self._choose_persistent()  # verifies, newest first, noting rejections
        if local_step is not None and (name is None or local_step >= checkpoint_step(name)):
            self._restore_tier = LOCAL
            return local_name
        self._restore_tier = PERSISTENT
        if name is not None:
            return name
        self._nothing_to_restore()
        return None

    def _choose_local(self) -> str | None:
        if self._ring is not None:
            # Every rank's inventory was gathered (_agree_ring); damage counts as rejections.
            for line in self._ring.refused:
                self._local_rejected.setdefault(line, line)
            step = self._ring_step
            return None if step is None else checkpoint_name(step)
        choice, rejected = choose_checkpoint(
            self.local.dir,
            self.local.storage,
            self.config,
            tidy=True,  # this run's own directory on this host (module docstring)
            skip=frozenset(self._local_rejected),
            ignore=self.ignore_config_keys,
            checksums_at_load=self._checksums_at_load,
        )
        for name, line in rejected.items():
            self._note_local_rejected(name, line)
        return choice

    def _reject_local(self, name: str, why: str, reason: str) -> None:
        self._note_local_rejected(name, reject(self.local.storage, name, why, reason))
        if why == "superseded":
            self._local_superseded.add(name)

    def _note_local_rejected(self, name: str, line: str) -> None:
        warnings.warn(f"local tier: {line}; falling back", stacklevel=6)
        self._local_rejected[name] = line

    def _rejected_lines(self) -> list[str]:
        lines = list(self._rejected.values())
        if self.local is not None:
            lines += [f"local tier: {line}" for line in self._local_rejected.values()]
        return lines

    def _foreign(self, state: dict) -> tuple[str, str] | None:
        """Why a local checkpoint is not this run's current branch, as ``(why, reason)``
        (None: it is, or it is persistent)."""
        if self.local is None or self._restore_tier != LOCAL:
            return None
        tiered = state.get("tiered")
        tiered = tiered if isinstance(tiered, dict) else {}
        owner = tiered.get("run_id")
        if owner != self.local.run_id:
            return "foreign", f"it belongs to run {owner!r}, not to this run ({self.local.run_id})"
        return superseded(tiered, self.local.generation, self.local.branch)

    def _settle_generation(self) -> None:
        """Once a session, before it saves anything: unless it went on from the local tier,
        it starts a new branch of the run (:mod:`~simulator.controller.local_tier`,
        "Branches"), so every rank's snapshots from now on record a new generation. When that
        cannot be recorded, the local tier is off for the session (a snapshot of the new branch
        could not be told from the old one's)."""
        if self.local is None or self._generation_settled:
            return
        self._generation_settled = True
        if not self.local.usable or self.restored_tier == LOCAL:
            return

        def record() -> tuple:  # rank 0's: its failure, its warning's included, reaches all
            if self.read_only:
                new, why = None, "the checkpoint directory is read-only"
            else:
                new, why = next_generation(
                    self.storage, self.root, self._run_record, remote=self._remote
                )
            if why is not None:
                self._disable_local(why)  # before the warning, which a filter may raise
                warnings.warn(
                    f"local tier disabled for this session: {self.local.disabled}; "
                    "checkpoints go to the persistent tier only",
                    stacklevel=user_stacklevel(),
                )
            return new, why

        new, why = self._on_rank0(record, f"recording the run's branch in {self.root}")
        if why is not None:
            self._disable_local(why)
            return
        self._run_record = new
        self.local.generation, self.local.branch = new.generation, new.branch
        # Its warning, which a filter may make fatal on one rank alone, heard on every rank.
        with failing_together(self.backend, "removing the snapshots of an earlier branch"):
            self._drop_superseded()

    def _disable_local(self, why: str) -> None:
        """The local tier off for the session: its new branch could not be recorded."""
        self.local.disabled = f"the run's new branch cannot be recorded ({why})"
        self.schedule.local_enabled = False

    def _drop_superseded(self) -> None:
        """Delete this rank's local snapshots of earlier generations: no restore takes them
        (they are dead branches), retention would count them as the newest, and a RAM-backed
        tier must not keep what can never be used."""
        stores = [self.local.storage]
        if self._ring is not None and self._ring.held is not None:
            stores.append(self._ring.held)
        dropped = []
        for store in stores:
            try:
                for name in store.list():
                    dead = checkpoint_step(name) is not None or name.endswith(_SUPERSEDED)
                    if dead and not store.is_symlink(name):
                        delete_checkpoint(store, name)
                        dropped.append(store.describe(name))
            except OSError as exc:
                warnings.warn(
                    f"local tier: cannot remove the snapshots of an earlier branch in "
                    f"{store.describe()}: {exc}",
                    stacklevel=user_stacklevel(),
                )
        if dropped:
            logger.info(
                "local tier: removed %d snapshot(s) of an earlier branch of the run: %s",
                len(dropped),
                ", ".join(dropped),
            )

    def _seed_tier(self, state: dict) -> None:
        tiered = state.get("tiered")
        if self.local is not None and isinstance(tiered, dict):
            self.schedule.seed_local(tiered.get("local_save_stall_s"))

    def _restored(self, step: int) -> None:
        """Say which tier the restore used (log, ``stats``, run log), and warn of a fallback."""
        if self.local is None:
            return
        self.restored_tier = self._restore_tier if step > 0 else None  # on every rank
        if self.backend.rank != 0:
            return
        where = self.local.root
        if self._ring is not None and self._ring_restored(step):
            return
        if self.restored_tier == LOCAL:
            logger.info("restored step %d from the local tier (%s)", step, where)
            return
        gone = self.local.usable and not self.local.found
        if step > 0 and (gone or self._local_rejected):
            if gone:
                why = "held nothing of this run (wiped, or a new host)"
            elif set(self._local_rejected) <= self._local_superseded:
                why = "held only snapshots of an earlier branch of the run"
            else:
                why = "held no intact checkpoint"
            warnings.warn(
                f"the local tier {where} {why}: restored step {step} from the persistent tier",
                stacklevel=3,
            )
        elif step > 0:
            logger.info("restored step %d from the persistent tier (%s)", step, self.root)
        elif gone and any(e["session"] != self.runlog.session for e in self.runlog.events()):
            warnings.warn(
                f"the local tier {where} held nothing of this run and the persistent tier has "
                "no checkpoint yet: starting from step 0",
                stacklevel=3,
            )

    def _restore_fields(self) -> dict:
        if self.local is None:
            return {}
        if self._ring is not None and self.restored_tier == LOCAL:
            return {"tier": LOCAL, "from_partners": list(self._ring.from_partners)}
        return {"tier": self.restored_tier}

    # -- the ring (torch.distributed: local_ring module) ------------------------------------
    def _agree_ring(self) -> None:
        """Collective, before rank 0 chooses: the newest step every rank can load locally."""
        self._ring_step = None
        if self._ring is not None and self.local.usable:
            self._ring_step = self._ring.agree()

    def _ring_state(self, name: str, template: dict) -> dict | None:
        """Collective: every rank's state of the agreed local step, its missing snapshots taken
        from partners first; None (the step excluded) when any rank cannot load it."""
        ring, rank = self._ring, self.backend.rank
        loaded: list[dict] = []

        def load() -> tuple[str | None, bool]:  # (why this rank cannot, moved aside)
            try:
                # Collective among the ranks that send and receive: every rank calls it.
                fetched = ring.fetch()
                if fetched is not None:
                    return fetched, False
                path = self.local.storage.local_copy(name)
                state = check_state(self.backend.read_own(path, template), where=name)
                foreign = self._foreign(state)
                error = misnamed(name, state.get("step")) or (foreign and foreign[1])
                loaded.append(state)
                return error, False
            except (CorruptCheckpoint, UnsafeCheckpoint) as exc:
                why = "unsafe" if isinstance(exc, UnsafeCheckpoint) else "corrupt"
                line = reject(self.local.storage, name, why, str(exc))
                warnings.warn(f"local tier: {line}", stacklevel=7)
                return f"rank {rank}'s {name}: {exc}", not self.local.storage.exists(name)
            except Exception as exc:  # said by every rank below
                return f"rank {rank}'s {name}: {type(exc).__name__}: {exc}", False

        # A failure that is no verdict on the snapshot (moving it aside, a warning turned into
        # an error, an interrupt) is raised on every rank, after the gather: none waits in it.
        results = ring.gather_work(load, f"loading its local snapshot {name}")
        errors = [e for e, _ in results if e is not None]
        if not errors:
            return loaded[0]
        step = checkpoint_step(name)
        # A snapshot that passed every check yet does not load was moved aside on its rank: the
        # next agreement takes that rank's partner copy of the same step, once. Anything else
        # (a copy fetched from the partner fails too, a rank cannot say why) passes it over.
        again = step not in ring.retried and all(moved for e, moved in results if e is not None)
        if again:
            ring.retried.add(step)
        else:
            ring.excluded.add(step)
        if rank == 0:
            line = f"{name} cannot be restored from the local tiers ({'; '.join(errors)})"
            then = "trying the partners' copies of it" if again else "trying an older one"
            self._local_rejected[name] = line
            logger.warning("local tier: %s; %s", line, then)
            try:  # raised by the next choice, on every rank (the checkpointer's _deferred)
                warnings.warn(f"local tier: {line}; {then}", stacklevel=4)
            except BaseException as exc:
                self._deferred = exc, f"warning that {name} cannot be restored"
        return None

    def _ring_restored(self, step: int) -> bool:
        """Rank 0: say where a ring restore came from; True when it said all there is."""
        ring = self._ring
        if self.restored_tier == LOCAL:
            took = ring.from_partners
            logger.info(
                "restored step %d from the local tier (%s)%s",
                step,
                self.local.root,
                f"; rank(s) {took} took their snapshots from copies that survived"
                if took
                else ", every rank from its own snapshot",
            )
            return True
        why = ring.notes + ring.refused
        if step > 0 and why:
            warnings.warn(
                f"the local tiers hold no snapshot of a step newer than the persistent one that "
                f"every rank can load ({'; '.join(why)}): restored step {step} from the "
                "persistent tier",
                stacklevel=4,
            )
            return True
        return False

    def _due_after_restore(self, step: int, age_s: float) -> int:
        if self.local is None:
            return self.schedule.next_due(step, age_s=age_s)
        persistent = step if self.restored_tier != LOCAL else (self._newest_persistent() or 0)
        return self.schedule.restart(step, persistent)

    def _after_tiered_restore(self, step: int) -> None:
        self._settle_generation()
        if self.local is not None and self.restored_tier == LOCAL:
            self._local_saved = step
            # Rank 0's view (it moved rejected ones aside).
            self._saved_step = self._on_rank0(self._newest_persistent, f"listing {self.root}")
            self.last_saved_step = self._saved_step

    def _final_step(self) -> int | None:
        """A restored local step the persistent tier lacks is the run's last state: close()
        saves it there (the final state goes to the tier every failure leaves intact)."""
        if self.local is not None and self.restored_tier == LOCAL:
            return self.resumed_from
        return None

    # -- preemption -------------------------------------------------------------------------
    def _expected_persistent_s(self) -> float | None:
        s = self.schedule
        stall = s.stall.value if s.stall.value is not None else s.checkpoint_prior_s
        if stall is None:
            return None
        if self.async_save and not self._sync_only:
            return stall + (s.write.value or 0.0)
        return stall

    def _preemption_tier(self, step: int) -> str:
        grace = self.preemption_grace_s
        if grace is None:
            return PERSISTENT
        since = 0.0 if self._signal_t is None else max(0.0, self.clock() - self._signal_t)
        left = grace - since
        expected = self._expected_persistent_s()
        local = self.local is not None and self.local.usable
        if expected is None and local:
            # Not timed yet (no persistent save this run, no prior): a local save is the one
            # sure to fit; the persistent tier gets the next scheduled save.
            logger.warning(
                "preemption: no persistent save has been timed yet, so none is known to fit in "
                "the %.3g s left of the %g s grace period: saving step %d to the local tier (%s)",
                left,
                grace,
                step,
                self.local.root,
            )
            return LOCAL
        if expected is None or expected <= left:
            return PERSISTENT
        if local:
            logger.warning(
                "preemption: a persistent save takes about %.3g s, more than the %.3g s left of "
                "the %g s grace period: saving step %d to the local tier (%s) instead",
                expected,
                left,
                grace,
                step,
                self.local.root,
            )
            return LOCAL
        logger.warning(
            "preemption: a persistent save takes about %.3g s, more than the %.3g s left of the "
            "%g s grace period, and there is no local tier: saving step %d to the persistent "
            "tier anyway; it may not finish before the kill",
            expected,
            left,
            grace,
            step,
        )
        return PERSISTENT

    def _preempted_fields(self, tier: str | None) -> dict:
        if self.local is None and self.preemption_grace_s is None:
            return {}
        out: dict[str, Any] = {"tier": tier or PERSISTENT}
        if self.preemption_grace_s is not None:
            out["grace_s"] = self.preemption_grace_s
        if self._signal_t is not None:
            out["since_signal_s"] = round(max(0.0, self.clock() - self._signal_t), 6)
        return out

    # -- stats ------------------------------------------------------------------------------
    def _tier_stats(self) -> dict:
        if self.local is None:
            return {}
        s = self.schedule
        return {
            "local_dir": str(self.local.root),
            "local_found": self.local.found,
            "local_disabled": self.local.disabled,
            "restored_tier": self.restored_tier,
            "local_saves": self.local_saves,
            "local_last_saved_step": self.local_last_saved_step,
            "local_save_stall_s": s.local_stall.value,
            "tier_interval_s": dict(s.tier_interval_s),
            "tier_interval_steps": dict(s.tier_interval_steps),
            "tier_next_due_step": dict(s.due),
            "failures_by_class": dict(s.past_by_class),
            "mtbf_by_class_s": {k: p.mtbf_s for k, p in s.class_posteriors.items()},
            "last_save_stall_s": {k: v for k, v in self._last_stalls.items() if k != "step"},
            **self._ring_stats(),
        }

    def _ring_stats(self) -> dict:
        ring = self._ring
        if ring is None:
            return {}
        return {
            "local_partner": ring.partner,
            "local_holds_copy_of": ring.source,
            "restored_from_partners": list(ring.from_partners),
        }
