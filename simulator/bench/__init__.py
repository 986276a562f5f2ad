"""The checkpoint benchmark: what a real save and restore cost on this machine's disk.

It builds the complete state a training resume needs — a GPT-style transformer's weights,
AdamW after one real step (both moments), the LR scheduler, the RNG states and the data
position — and writes that same state in each format people use (``torch.save``,
safetensors, DCP, DCP async, and this project's own :mod:`simulator.ckptio`), with fsync,
interleaved with a raw sequential write of the state's own bytes (plain ``os.write``, no
format), so every format is
measured against the disk it ran on, in the same run; ``writers`` adds N processes saving one
sharded state at once against N raw writers (:mod:`simulator.bench.writers`); a reduced
``optimizer_precision``/``weights_precision`` adds the controller's smaller saves beside the
exact ones (:func:`simulator.bench.formats.save_reduced`). The samples feed
:mod:`simulator.model.checkpoint_cost`. This package imports torch; the simulation core does not.
"""

from simulator.bench.runner import BenchConfig, BenchResult, run_benchmark
from simulator.bench.state import FORMATS, SIZE_NAMES, TrainingState, build_state, parse_size

__all__ = [
    "FORMATS",
    "SIZE_NAMES",
    "BenchConfig",
    "BenchResult",
    "TrainingState",
    "build_state",
    "parse_size",
    "run_benchmark",
]
