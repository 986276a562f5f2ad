"""Crash test: a real training job, killed on a failure clock, resumed from its checkpoints.

The closed-loop study (``experiments/closed_loop.py``) uses these pieces: ``train_gpt`` (the
job: a small GPT on a generated corpus, checkpointed by ``AdaptiveCheckpointer``, logging its
time to a JSONL file), ``injector`` (the failure clock and the SIGKILL), ``supervisor`` (runs
the job to completion through the kills), ``accounting`` (turns the logs into wall, useful,
lost, saving and recovery seconds) and ``predict`` (what the simulator says the same run costs);
``study_cli`` is the command line it shares with the tiered study (``closed_loop_tiers.py``).
"""
