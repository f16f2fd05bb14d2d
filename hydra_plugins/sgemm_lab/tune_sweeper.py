"""The tuning sweeper: `python -m src.run -m +tune=<kernel>` (conf/tune/) searches a kernel's
tile parameters, exhaustively (`tune.strategy=grid`) or with Optuna's TPE (`tune.strategy=tpe
tune.trials=N`) or over a list of candidates (`++tune.candidates=[{...},...]`, or a JSON file
of one, `++tune.candidates_file=F`, as `sgemm-lab tune`'s stages pass them), and can write the
best into conf/tuned/<gpu>.yaml (`tune.write_back=true`).

Why our own sweeper, not hydra-optuna-sweeper: that plugin pins optuna < 3, which does not work
with current SQLAlchemy (MLflow needs a current one), and it has no notion of candidates that
are invalid by construction, of a measurement cache or of compiling ahead. This one is small and
runs on current Optuna (imported only for tpe):

1. Other sweep arguments (e.g. `size=1024,4096`) expand as in Hydra's basic sweeper; each
   combination is tuned on its own (its candidates, pruning and summary), and with a grid the
   candidates of successive combinations share launches (no GPU idles at a problem's end).
2. Every candidate is checked against the kernel's constraints with the GPU's limits; broken
   ones are pruned (counted per rule) and never compiled (src/tune/space.py).
3. With `resume=true` (the tune configs' default), a candidate whose exact measurement is in the
   cache (src/job/cache.py) is not run again: its record is reused (marked from_cache, with
   the MLflow run that measured it) and written to the sweep directory like a job's.
4. The rest are compiled on CPU threads ahead of time (NVRTC, src/compile.precompile) while the
   launcher runs them as ordinary jobs: each GPU times one kernel at a time (on a node of
   several GPUs the lab's launcher runs a job on each at once, gpu_launcher.py).
5. The summary (counts of pruned / failed to compile / failed verification / ok, the top ten)
   goes to the console and tune_summary.md/.json in the sweep directory, which the sweep's
   MLflow run (src/callbacks.MlflowSweep) picks up with a table of every trial
   (tune_trials.json); each trial measured by this sweep is a child run of it.
"""

# (no `from __future__ import annotations`: Hydra execs plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations)

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("sgemm")
SUMMARY_JSON = "tune_summary.json"
SUMMARY_MD = "tune_summary.md"


class TuneSweeper(Sweeper):
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context = None
        self.launcher = None
        self.job_idx = 0

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    # --- Hydra's entry ---------------------------------------------------------------------

    def sweep(self, arguments: list[str]) -> Any:
        from src.tune import space as tune
        from src.errors import LabError

        try:
            settings = tune.Settings.from_cfg(self.config.get("tune"))
        except LabError as exc:  # a bad tuning config: say which rule, no traceback
            log.error("error [%s]: %s", exc.status, exc)
            raise SystemExit(1) from None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        combos = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)[0]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        summaries = []
        with ThreadPoolExecutor(max_workers=settings.compile_threads,
                                thread_name_prefix="nvrtc") as executor:
            try:
                if settings.strategy == "grid":
                    summaries = self._grid(settings, [list(c) for c in combos], sweep_dir, executor)
                else:
                    for combo in combos:
                        summaries.append(self._tune(settings, list(combo), sweep_dir, executor))
            except LabError as exc:  # no GPU, a broken kernel config: one clear error
                log.error("error [%s]: %s", exc.status, exc)
                raise SystemExit(1) from None
            finally:
                executor.shutdown(wait=False, cancel_futures=True)
        self._write(sweep_dir, summaries)
        return summaries

    # --- one problem --------------------------------------------------------------------------

    def _grid(self, settings, combos: list, sweep_dir: Path, executor) -> list[dict]:
        """Every problem's candidates (grid, or the listed ones), planned one problem after
        another and launched in chunks that run on across problems: a launch returns when its
        last job does, so one per problem left GPUs idle at each problem's end and composed its
        few candidates with the GPUs idle before it."""
        chunk = max(settings.batch, 32) * getattr(self.launcher, "slots", 1)
        planned, pending, room = [], [], chunk
        for combo in combos:
            plan = self._plan(settings, combo, sweep_dir, executor)
            planned.append(plan)
            items = list(plan.valid)
            while items:
                pending.append((plan, items[:room]))
                room, items = room - len(items[:room]), items[room:]
                if room == 0:
                    self._evaluate_many(pending, sweep_dir)
                    pending, room = [], chunk
        if pending:
            self._evaluate_many(pending, sweep_dir)
        return [self._summary(settings, plan) for plan in planned]

    def _tune(self, settings, combo: list[str], sweep_dir: Path, executor) -> dict:
        """One problem, its candidates asked of TPE in batches (strategy tpe)."""
        plan = self._plan(settings, combo, sweep_dir, executor)
        _progress_total(settings.trials)
        self._tpe(settings, plan.kernel_cfg, plan.state.problem, plan.limits, plan.state,
                  plan.compile_ahead, lambda batch: self._evaluate_many([(plan, batch)], sweep_dir))
        return self._summary(settings, plan)

    def _plan(self, settings, combo: list[str], sweep_dir: Path, executor) -> "_Plan":
        """One problem: its config, the kernel as configured (untuned), the GPU's limits and,
        for grid, the candidates the constraints leave (compiled ahead on CPU threads)."""
        from src.job.cache import Cache
        from src.job.compile import build_arch, precompile
        from src.job.prepare import prepare_kernel, target
        from src.errors import NoGPU
        from src.job import gpu as gpu_mod
        from src.job.problem import Problem
        from src.job.protocol import BenchProtocol
        from src.tune import space as tune

        started = time.perf_counter()
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, combo)
        kernel_cfg = OmegaConf.to_container(cfg.kernel, resolve=True)
        bench = BenchProtocol.from_config(OmegaConf.to_container(cfg.bench, resolve=True))
        problem = Problem.from_cfg(cfg)
        where = target(cfg.gpu)
        # No GPU here, and the candidates run here: stop before launching any, each would only
        # fail no_gpu. A launcher that runs them elsewhere (SLURM) is left to do so: a cluster's
        # login node has no GPU, its GPU nodes do (the constraints use the named gpu's limits).
        runs_here = "slurm" not in str(self.config.hydra.launcher.get("_target_", "")).lower()
        if where.device is None and runs_here:
            try:
                gpu_mod.detect()
            except NoGPU as exc:
                raise NoGPU(f"{exc} A tuning sweep measures its candidates on a GPU; none was "
                            f"started.") from None
        # the kernel as configured, untuned: its source, and what each candidate's spec replaces
        base = prepare_kernel(kernel_cfg, problem, where, bench, use_tuned=False)
        device = where.device
        cache = Cache(cfg.cache_dir) if (cfg.get("resume") and device) else None
        state = _State(combo=combo, problem=problem, kernel=kernel_cfg["name"])

        def compile_ahead(specs):
            arch = build_arch(base.spec, device)
            if arch is not None:
                precompile([(s.name, base.source, s.entry) for s in specs], arch, cfg.cache_dir,
                           executor=executor)

        plan = _Plan(state, base, cache, kernel_cfg, where.limits, where.gpu_spec_name, device,
                     started, compile_ahead)
        if settings.strategy == "grid":
            candidates = tune.candidates_of(settings)
            pruning = tune.prune(kernel_cfg, candidates, problem, where.limits)
            held = tune.held_at(settings, problem)
            if held:  # the evidence holds these: counted as pruned, never compiled or run
                kept = [(p, s) for p, s in pruning.valid if tune.params_key(p) not in held]
                pruning.pruned[tune.HELD] += len(pruning.valid) - len(kept)
                pruning.valid = kept
            state.pruned.update(pruning.pruned)
            state.considered = len(candidates)
            log.info("tune %s at %s: %d candidates, %d pruned by the constraints, %d to measure",
                     state.kernel, problem.label, len(candidates), pruning.pruned_total,
                     len(pruning.valid))
            _progress_total(len(pruning.valid))
            compile_ahead([spec for _, spec in pruning.valid])
            plan.valid = list(pruning.valid)
        return plan

    def _summary(self, settings, plan: "_Plan") -> dict:
        """One problem's summary (src/tune/space.py summary; seconds from its plan to here), and
        its write-back when asked."""
        from src.tune import space as tune

        state = plan.state
        data = tune.summary(settings, state.kernel, state.problem, state.records, state.pruned,
                            state.considered, state.cached, time.perf_counter() - plan.started,
                            plan.device.name if plan.device else None)
        data["gpu_spec"] = plan.gpu_spec
        data["overrides"] = state.combo
        if settings.write_back:
            self._write_back(settings, data, plan.gpu_spec)
        return data

    def _tpe(self, settings, kernel_cfg, problem, limits, state, compile_ahead, evaluate) -> None:
        from src.tune import space as tune
        from src.tune.tpe import TpeSearch

        search = TpeSearch(settings.space, settings.seed)
        max_asks = 50 * settings.trials
        asks = 0
        while len(state.records) < settings.trials and asks < max_asks:
            batch, repeats = [], []
            wanted = min(settings.batch, settings.trials - len(state.records))
            while len(batch) < wanted and asks < max_asks:
                trial, params = search.ask()
                asks += 1
                state.considered += 1
                verdict = tune.check(kernel_cfg, params, problem, limits)
                if isinstance(verdict, str):
                    state.pruned[verdict] += 1
                    search.tell(trial, None, pruned=True)
                    continue
                key = tune.params_key(params)
                if key in state.seen or any(tune.params_key(p) == key for _, p, _ in batch):
                    repeats.append((trial, key))  # asked again: told the known result, not re-run
                    continue
                batch.append((trial, params, verdict))
            compile_ahead([spec for _, _, spec in batch])
            records = evaluate([(params, spec) for _, params, spec in batch])
            for (trial, _, _), record in zip(batch, records):
                search.tell(trial, record.gflops if record.ok else None)
            for trial, key in repeats:
                known = state.seen[key]
                search.tell(trial, known.gflops if known.ok else None)

    # --- measuring a batch ------------------------------------------------------------------

    def _evaluate_many(self, pieces, sweep_dir) -> list:
        """Measure `pieces` [(plan, [(params, spec), ...])], of one problem or several, in one
        launch: a candidate whose exact measurement is cached (resume) is reused, the others run
        as jobs; each record goes to its problem's state in the pieces' order."""
        from dataclasses import replace

        from src.job.cache import key as measurement_key
        from src.records.record import Record, mark_failed
        from src.sweep.worker import WorkerCrashed
        from src.tune import space as tune

        outs = [[None] * len(batch) for _, batch in pieces]
        launch = []  # (piece, index in its batch)
        for p, (plan, batch) in enumerate(pieces):
            state = plan.state
            for i, (params, spec) in enumerate(batch):
                hit = None if plan.cache is None else plan.cache.get(
                    measurement_key(replace(plan.base, spec=spec)))
                if hit is None:
                    launch.append((p, i))
                    continue
                hit.from_cache = True
                name = f"{self.job_idx}_{state.kernel}_{state.problem.m}x{state.problem.n}x{state.problem.k}"
                self.job_idx += 1
                hit.write(sweep_dir / name)  # the sweep's record; its MLflow run is the
                # one that measured it (hit.mlflow_run_id), listed in the sweep run's trials
                state.cached += 1
                _progress_reused()
                outs[p][i] = hit
        if launch:
            overrides = [pieces[p][0].state.combo + tune.overrides_for(pieces[p][1][i][0])
                         for p, i in launch]
            returns = self.launcher.launch(overrides, initial_job_idx=self.job_idx)
            self.job_idx += len(launch)
            for (p, i), ret in zip(launch, returns):
                try:
                    outs[p][i] = Record.from_dict(ret.return_value)
                except Exception as exc:  # the job raised instead of returning its record
                    problem = pieces[p][0].state.problem
                    record = Record(kernel=pieces[p][0].state.kernel, precision="fp32",
                                    backend="nvrtc", m=problem.m, n=problem.n, k=problem.k,
                                    alpha=problem.alpha, beta=problem.beta,
                                    params=dict(pieces[p][1][i][0]))
                    mark_failed(record, WorkerCrashed(f"the job raised: {type(exc).__name__}: {exc}"))
                    outs[p][i] = record
        for (plan, batch), out in zip(pieces, outs):
            for (params, _), record in zip(batch, out):
                plan.state.records.append(record)
                plan.state.seen[tune.params_key(params)] = record
        return [record for out in outs for record in out]

    # --- the end ------------------------------------------------------------------------------

    def _write_back(self, settings, data: dict, gpu_spec: str) -> None:
        from src.tune import space as tune
        from src.job.config import forget as forget_composed
        from src.job.tuned import tuned_file

        if data["best"] is None:
            log.warning("nothing verified: conf/tuned/%s.yaml left as it was", gpu_spec)
            return
        path = tuned_file(gpu_spec)
        tune.write_back(path, data["kernel"], settings.size_class, data["best"]["params"],
                        tune.why_note(data, settings.size_class))
        forget_composed()  # the next lookup composes the file as written
        data["written_to"] = str(path)
        log.info("best parameters for %s (when %s) written to %s", data["kernel"],
                 settings.size_class, path)

    def _write(self, sweep_dir: Path, summaries: list[dict]) -> None:
        from src.tune import space as tune

        text = "\n".join(tune.summary_markdown(data) for data in summaries)
        for data in summaries:
            if data.get("written_to"):
                text += f"\nwritten to {data['written_to']}\n"
        (sweep_dir / SUMMARY_MD).write_text(text)
        (sweep_dir / SUMMARY_JSON).write_text(json.dumps(summaries, indent=2, default=str) + "\n")
        print("\n" + text, flush=True)


def _progress_total(count: int) -> None:
    from src.sweep import progress

    if progress.current is not None:  # the candidates this problem will measure
        progress.current.add_total(count)


def _progress_reused() -> None:
    from src.sweep import progress

    if progress.current is not None:
        progress.current.reused(1)


class _Plan:
    """One problem, planned: its state, the kernel as configured (`base`), the measurement cache
    (None: measure everything), the GPU's limits and spec, and, for grid, the candidates left."""

    def __init__(self, state, base, cache, kernel_cfg, limits, gpu_spec, device, started,
                 compile_ahead):
        self.state, self.base, self.cache = state, base, cache
        self.kernel_cfg, self.limits, self.gpu_spec, self.device = kernel_cfg, limits, gpu_spec, device
        self.started, self.compile_ahead = started, compile_ahead
        self.valid: list = []


class _State:
    """What one problem's tuning has seen so far."""

    def __init__(self, combo, problem, kernel):
        from collections import Counter

        self.combo = combo
        self.problem = problem
        self.kernel = kernel
        self.records: list = []
        self.seen: dict = {}
        self.pruned: Counter = Counter()
        self.considered = 0
        self.cached = 0
