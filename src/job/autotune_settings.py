"""The run-time autotune's settings (dispatch.*, conf/dispatch/default.yaml), read and checked:
whether it is on, how many candidates it measures and where, its brief protocol, its margin, and
its variants (params laid over the rule's choice, measured after it: a parameter value the
tuner's grid does not hold yet, tried on the user's GPU at the shapes autotune measures).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from src.errors import ConfigError
from src.paths import CONF_DIR


@dataclass(frozen=True)
class Variant:
    """dispatch.autotune_variants[i]: where the rule's choice is `kernel`, it is measured again
    with `params` laid over its own (a launch it does not already build), right after it."""

    kernel: str
    params: tuple[tuple[str, object], ...]   # (name, value) pairs, in the config's order
    why: str

    def over(self, params: dict) -> dict:
        return {**params, **dict(self.params)}


@dataclass(frozen=True)
class Settings:
    """dispatch.* (conf/dispatch/default.yaml)."""

    enabled: bool = False
    candidates: int = 4                          # what each dispatcher measures unless `counts` names it
    counts: tuple[tuple[str, int], ...] = ()     # (dispatcher, count): dispatch.autotune_candidates as a mapping
    max_distance: float = 0.5
    nearest: int = 3
    protocol: str = "tune"
    evidence: str | None = None
    margin: float = 0.02
    variants: tuple[Variant, ...] = ()

    def count(self, dispatcher: str) -> int:
        """How many launches autotune measures for `dispatcher` (best_fp32, best_tf32)."""
        return dict(self.counts).get(dispatcher, self.candidates)

    @classmethod
    def from_cfg(cls, cfg) -> Settings:
        """The job's dispatch.* settings (defaults where the config has none); ConfigError naming
        the first value that breaks its rule."""
        data = cfg.get("dispatch") if cfg is not None else None
        data = OmegaConf.to_container(data, resolve=True) if OmegaConf.is_config(data) else dict(data or {})

        def bad(key: str, rule: str) -> ConfigError:
            return ConfigError(f"dispatch.{key} = {data.get(key)!r} is not allowed (rule: {rule}).")

        enabled = data.get("autotune", False)
        if not isinstance(enabled, bool):
            raise bad("autotune", "dispatch.autotune is true or false")
        count, counts = candidate_counts(data.get("autotune_candidates", cls.candidates))
        nearest = data.get("autotune_nearest", cls.nearest)
        if isinstance(nearest, bool) or not isinstance(nearest, int) or nearest < 1:
            raise bad("autotune_nearest", "at least 1 training shape, an integer")
        distance = data.get("autotune_max_distance", cls.max_distance)
        if isinstance(distance, bool) or not isinstance(distance, (int, float)) or distance < 0:
            raise bad("autotune_max_distance", "a log2 distance, a number >= 0")
        protocol = str(data.get("autotune_protocol", cls.protocol))
        if not (CONF_DIR / "bench" / f"{protocol}.yaml").is_file():
            raise bad("autotune_protocol", "the name of a conf/bench/ file")
        evidence = data.get("autotune_evidence")
        margin = data.get("autotune_margin", cls.margin)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0:
            raise bad("autotune_margin", "a fraction of the rule's choice's GFLOP/s, a number >= 0")
        return cls(enabled, count, counts, float(distance), nearest, protocol,
                   None if evidence in (None, "") else str(evidence), float(margin),
                   variants(data.get("autotune_variants")))


def candidate_counts(value) -> tuple[int, tuple[tuple[str, int], ...]]:
    """dispatch.autotune_candidates checked: one count for every dispatcher, or {dispatcher: count}
    (a dispatcher it does not name measures Settings.candidates); ConfigError naming the entry."""
    pairs = sorted(value.items()) if isinstance(value, dict) else [("", value)]
    for name, count in pairs:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or (
                name and not (CONF_DIR / "kernel" / f"{name}.yaml").is_file()):
            raise ConfigError(
                f"dispatch.autotune_candidates{'.' + str(name) if name else ''} = {count!r} is not "
                f"allowed (rule: at least 1 candidate, an integer (the rule's choice is the first), "
                f"for every dispatcher or for each named one, {{dispatcher: count}} naming "
                f"conf/kernel/ dispatchers such as best_fp32).")
    return (Settings.candidates, tuple(pairs)) if isinstance(value, dict) else (value, ())


def variants(listed) -> tuple[Variant, ...]:
    """dispatch.autotune_variants checked: a list of {kernel, set, why}, each `kernel` a kernel of
    conf/kernel/ and each name of `set` one of its params; ConfigError naming the rule."""
    from src.job.config import kernel_config

    rule = ("dispatch.autotune_variants is a list of {kernel: a conf/kernel/ name, set: {param: "
            "value, ...} of that kernel's params, why: one line}")
    out = []
    for index, entry in enumerate(listed or []):
        where = f"dispatch.autotune_variants[{index}] = {entry!r}"
        if not isinstance(entry, dict) or set(entry) != {"kernel", "set", "why"} or not isinstance(
                entry["set"], dict) or not entry["set"] or not str(entry["why"] or "").strip():
            raise ConfigError(f"{where} is not allowed (rule: {rule}).")
        kernel = str(entry["kernel"])
        if not (CONF_DIR / "kernel" / f"{kernel}.yaml").is_file():
            raise ConfigError(f"{where} names no kernel config conf/kernel/{kernel}.yaml (rule: {rule}).")
        unknown = sorted(set(entry["set"]) - set(kernel_config(kernel).get("params") or {}))
        if unknown:
            raise ConfigError(f"{where} sets {', '.join(unknown)}, which {kernel} does not have "
                              f"(rule: {rule}).")
        out.append(Variant(kernel, tuple(entry["set"].items()), str(entry["why"]).strip()))
    return tuple(out)


def default_settings() -> Settings:
    """dispatch.* as a plain run composes it (conf/dispatch/default.yaml): what the publishing
    steps check a row's autotune against."""
    return Settings.from_cfg({"dispatch": OmegaConf.load(CONF_DIR / "dispatch" / "default.yaml")})
