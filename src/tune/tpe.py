"""The model-based tuning strategy (`tune.strategy=tpe`): Optuna's TPE sampler over a kernel's
space, asked and told by the tuning sweeper (hydra_plugins/sgemm_lab/tune_sweeper.py) beside the
exhaustive grid of src/tune/space.py. Optuna is imported only here."""
from __future__ import annotations


class TpeSearch:
    """Optuna's TPE sampler over the space (every parameter categorical), driven by ask and
    tell: the sweeper asks for a batch, prunes, measures, and tells each result. A pruned
    candidate is told PRUNED (TPE counts it among the bad ones and learns to avoid its
    region), a failed one FAIL, a measured one its GFLOP/s. Optuna is imported only here."""

    def __init__(self, space: dict[str, list], seed: int, startup: int = 10):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.space = space
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                             multivariate=True, constant_liar=True)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)

    def ask(self):
        trial = self.study.ask()
        params = {name: trial.suggest_categorical(name, values)
                  for name, values in self.space.items()}
        return trial, params

    def tell(self, trial, gflops: float | None, pruned: bool = False) -> None:
        state = self._optuna.trial.TrialState
        if pruned:
            self.study.tell(trial, state=state.PRUNED)
        elif gflops is None:
            self.study.tell(trial, state=state.FAIL)
        else:
            self.study.tell(trial, gflops)
