"""The lab's default sweeper (conf/hydra/sweeper/basic.yaml: Hydra picks `basic` by default):
Hydra's basic sweeper (the same jobs, order and batches, `hydra.sweeper.params` included) without
its check that composes every job of a batch before launching it, when the launcher composes
every job of the batch before starting any itself (gpu_launcher.GpuLauncher: that compose is the
check, so each job is composed once, not twice; the check was 20.7 s of a 52 s profile of the
main sweep). Any other launcher (SLURM's) gets Hydra's check as before.
"""

# (no `from __future__ import annotations`: Hydra execs plugin modules outside sys.modules)

from typing import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class LabSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if getattr(self.launcher, "composes_batch_first", False):
            return
        super().validate_batch_is_legal(batch)
