"""Which steps the per-step meters run on: the first steps after start or resume, then every N-th.

The saved-tensor meter (a Python hook on every tensor autograd saves), the memory reading
and the sync-wait probe (one extra collective before the gradient sync) cost up to ~8 % of
a step on a CPU, mostly the saved-tensor meter (BENCHMARKS.md: benchmarks/train_overhead.py,
one process; benchmarks/meter_overhead.py, DDP, where the shared machine's noise is as large).
What they read does
not change from step to step in a fixed-shape run: the saved-activation peak, parameter,
gradient and optimizer bytes are the same on every step once the optimizer has stepped
once, so a few steps measure them exactly. `training.measure_every` sets N; 1 meters
every step.
"""

from __future__ import annotations

from dataclasses import dataclass

# Steps metered after start or resume: the first holds the memory figures (optimizer state
# exists after its update); the next ones give the sync-wait probe steady steps past DDP's
# bucket rebuild in step 2, for `diagnose`'s medians.
STEPS_AT_START = 5

# Where the default `measure_every` comes from: every-step metering measured up to ~8 % of a step
# on a CPU, so metering one step in 20 costs at most 0.4 % in steady state.
EVERY_STEP_COST = "up to ~8 % of a step on a CPU"


@dataclass(frozen=True)
class MeterSchedule:
    """Meter step numbers (1-based, as the metrics lines count them) of one process's run.

    Metered: the `STEPS_AT_START` steps after `first_step` (0 for a fresh run, the checkpoint's
    step after a resume), every step divisible by `every`, and the last step (`max_steps`), so
    the run's final memory figures come from its final step as before.
    """

    first_step: int
    every: int
    max_steps: int

    def due(self, step: int) -> bool:
        """Whether step number `step` (1-based) runs the meters."""
        return (step <= self.first_step + STEPS_AT_START or step % self.every == 0
                or step == self.max_steps)

    def header_line(self) -> str:
        """The run header's line: which steps are metered, and why."""
        if self.every == 1:
            return "meters (memory, sync wait): every step (training.measure_every=1)"
        return (f"meters (memory, sync wait): the first {STEPS_AT_START} steps, every {self.every}th and the last "
                f"(training.measure_every={self.every}; on every step they cost {EVERY_STEP_COST}, and "
                "a fixed-shape run's memory is the same on every step)")
