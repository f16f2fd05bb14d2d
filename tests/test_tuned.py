"""Tuned parameters: conf/tuned/<gpu>.yaml size classes, their precedence, and the job's use of them."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from src.job import tuned
from src.errors import ConfigError
from src.job.config import tuned_config
from src.job.rules import first_rule
from src.job.gpu import known_specs, limits_from_spec
from src.job.pipeline import run_job
from src.job.problem import Problem
from src.job.spec import build_spec
from tests.conftest import CONF_DIR, chapter_shapes

SMALL, LARGE = Problem(1024, 1024, 1024, 1, 0), Problem(4096, 4096, 4096, 1, 0)


def use_tuned_dir(monkeypatch, folder):
    """Tuned files from `folder` instead of conf/tuned/ (which the runner composes with Hydra)."""
    monkeypatch.setattr(tuned, "tuned_config", lambda gpu: OmegaConf.to_container(
        OmegaConf.load(folder / f"{gpu}.yaml")) if (folder / f"{gpu}.yaml").is_file() else None)


def test_size_classes_pick_the_first_that_applies(tmp_path, monkeypatch):
    (tmp_path / "g.yaml").write_text(
        "kernels:\n  k:\n"
        "    - {when: 'n % 4 != 0', params: {bm: 1}}\n"
        "    - {when: 'm * n <= 2048 * 2048', params: {bm: 2, split_k: 2}}\n"
        "    - {when: 'True', params: {bm: 3}}\n")
    use_tuned_dir(monkeypatch, tmp_path)
    assert tuned.lookup("k", "g", Problem(1000, 1002, 8, 1, 0)).params == {"bm": 1}
    small = tuned.lookup("k", "g", SMALL)
    assert small.params == {"bm": 2, "split_k": 2}
    assert small.source == "conf/tuned/g.yaml: k[1] (when m * n <= 2048 * 2048)"
    assert tuned.lookup("k", "g", LARGE).params == {"bm": 3}


def test_h100_flagship_classes():
    """The committed H100 file: split-K at 1024, none at 4096, 4-byte copies for odd rows."""
    small = tuned.lookup("17_flagship", "h100_sxm", SMALL)
    large = tuned.lookup("17_flagship", "h100_sxm", LARGE)
    odd = tuned.lookup("17_flagship", "h100_sxm", Problem(4095, 4097, 333, 1, 0))
    assert small.params["split_k"] > 1 and "split_k" not in large.params
    assert odd.source.endswith("(when n % 4 != 0 or k % 4 != 0)")


def test_explicit_parameters_are_left_alone():
    choice = tuned.lookup("17_flagship", "h100_sxm", LARGE, explicit={"bk", "stages"})
    assert "bk" not in choice.params and "stages" not in choice.params and "bm" in choice.params


def test_no_file_or_no_entry_means_defaults():
    assert tuned.lookup("17_flagship", "no_such_gpu", LARGE) == tuned.TunedChoice()
    assert tuned.lookup("06_vectorize", "h100_sxm", LARGE) == tuned.TunedChoice()


def test_bad_when_expression_is_a_config_error(tmp_path, monkeypatch):
    (tmp_path / "x.yaml").write_text("kernels:\n  k: [{when: 'm >', params: {bm: 1}}]\n")
    use_tuned_dir(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match="bad `when`"):
        tuned.lookup("k", "x", LARGE)


def test_explicit_params_from_hydra_overrides():
    assert tuned.explicit_params(["kernel=17_flagship", "kernel.params.bk=16", "+kernel.params.x=1",
                                  "size=4096", "bench.seed=3"]) == {"bk", "x"}


@pytest.mark.parametrize("path", sorted((CONF_DIR / "tuned").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_tuned_entry_is_valid_for_its_kernel_and_gpu(path):
    """Tuned files name a known GPU spec and tuned kernels, and every class passes the kernel's
    constraints at the published sizes it applies to (a shape-limited chapter: at its own
    shapes)."""
    assert path.stem in known_specs()
    data = tuned_config(path.stem)  # as composed: h200.yaml starts from h100_sxm.yaml
    for kernel, classes in data["kernels"].items():
        cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / f"{kernel}.yaml"))
        assert cfg.get("tuned"), f"{kernel} does not read tuned values"
        assert classes[-1]["when"] == "True", "the last class must catch every size"
        for shape in chapter_shapes(kernel):
            problem = Problem(*shape, 1, 0)
            merged = dict(cfg, params=dict(cfg["params"]))
            tuned.apply(merged, path.stem, problem)
            build_spec(merged, problem, limits_from_spec(path.stem))


def test_job_records_the_tuned_parameters_it_used(compose):
    """Without a GPU the job still resolves its parameters (for gpu=auto: an H100 SXM's) before
    failing with no_gpu (gpu=h100_sxm names the tuned file on any machine); explicit command-line values beat tuned ones, use_tuned=false skips them."""
    record = run_job(compose("kernel=17_flagship", "gpu=h100_sxm", "size=1024"))
    assert record.tuned_from and "(when m * n <= 1536 * 1536)" in record.tuned_from
    assert record.params["split_k"] == tuned.lookup("17_flagship", "h100_sxm", SMALL).params["split_k"]
    record = run_job(compose("kernel=17_flagship", "gpu=h100_sxm", "size=1024", "kernel.params.split_k=3"),
                     explicit_params={"split_k"})
    assert record.params["split_k"] == 3
    record = run_job(compose("kernel=17_flagship", "gpu=h100_sxm", "size=1024", "use_tuned=false"))
    assert record.tuned_from is None and record.params["split_k"] == 1


def test_apply_merges_only_into_tuned_configs():
    untuned = {"name": "06_vectorize", "params": {"bk": 8}}
    assert tuned.apply(untuned, "h100_sxm", LARGE) == tuned.TunedChoice()
    assert untuned["params"] == {"bk": 8}
    cfg = {"name": "17_flagship", "tuned": True, "params": {"bk": 99, "group_m": 8}}
    choice = tuned.apply(cfg, "h100_sxm", LARGE, explicit={"bk"})
    assert cfg["params"] == {"bk": 99, "group_m": 8, **choice.params} and "bk" not in choice.params


def tuned_entries(path):
    """(where, entry) for every size class and dispatch rule written in one tuned file."""
    data = OmegaConf.to_container(OmegaConf.load(path))
    for section in ("kernels", "dispatch"):
        for name, entries in (data.get(section) or {}).items():
            for index, entry in enumerate(entries or []):
                yield f"{path.name}: {section}.{name}[{index}]", entry


def test_tuned_files_carry_one_line_whys_and_no_measured_prose():
    """A tuned file says what each class or rule is for in one short line; the evidence lives in
    git history, the published tables and the tuning sweeps' summaries, not in the config."""
    files = sorted((CONF_DIR / "tuned").glob("*.yaml"))
    entries = [e for path in files for e in tuned_entries(path)]
    assert len(entries) >= 30  # the H100's classes and rules are all checked
    for where, entry in entries:
        assert "measured" not in entry, f"{where} still has a `measured` string"
        why = entry.get("why")
        assert isinstance(why, str) and why.strip(), f"{where} has no `why`"
        assert "\n" not in why and len(why) <= 100, f"{where}: `why` over one line of 100: {why!r}"
    for path in files:  # and the `why` lines themselves fit in 100 columns
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.lstrip().startswith("why:"):
                assert len(line) <= 100, f"{path.name}:{number} is {len(line)} characters"


def test_first_rule_is_the_first_whose_when_holds():
    rules = [{"when": "m > 100", "id": 0}, {"id": 1}, {"when": "k > 0", "id": 2}]
    names = {"m": 64, "n": 64, "k": 64}
    assert first_rule(rules, names, "x.yaml: size class k") == (1, rules[1])  # no `when`: always
    assert first_rule(rules[:1], names, "x.yaml: size class k") is None
    assert first_rule(rules[:1], {**names, "m": 128}, "x.yaml: size class k") == (0, rules[0])
    assert first_rule([{"when": "ceil_div(m, 64) == 1"}], names, "w") == (0, {"when": "ceil_div(m, 64) == 1"})


def test_first_rule_vets_rules_up_to_the_winner_and_names_a_bad_one():
    seen = []
    rules = [{"when": "False"}, {"when": "True"}, {"when": "m >"}]
    assert first_rule(rules, {"m": 1}, "w", check=lambda i, rule: seen.append(i)) == (1, rules[1])
    assert seen == [0, 1]  # the rules after the winner are not read
    with pytest.raises(ConfigError) as error:
        first_rule(rules[2:], {"m": 1}, "conf/tuned/h100_sxm.yaml: dispatch rule best_fp32")
    assert str(error.value).startswith(
        "conf/tuned/h100_sxm.yaml: dispatch rule best_fp32[0] has a bad `when` expression 'm >': ")


def test_known_specs_are_read_again_when_a_spec_file_changes(tmp_path, monkeypatch):
    """conf/gpu/ is read once while its files are unchanged; an edited or added file is read."""
    from src.job import gpu

    (tmp_path / "a100.yaml").write_text("name: a100\nsms: 108\n")
    (tmp_path / "auto.yaml").write_text("name: auto\n")
    monkeypatch.setattr(gpu, "GPU_CONF_DIR", tmp_path)
    first = gpu.known_specs()
    assert first == {"a100": {"name": "a100", "sms": 108}}
    first["a100"]["sms"] = 0  # the caller's copy, not the kept one
    assert gpu.known_specs()["a100"]["sms"] == 108
    (tmp_path / "a100.yaml").write_text("name: a100\nsms: 1080\n")
    (tmp_path / "h100_sxm.yaml").write_text("name: h100_sxm\nsms: 132\n")
    assert {k: v["sms"] for k, v in gpu.known_specs().items()} == {"a100": 1080, "h100_sxm": 132}


def test_a_gpus_own_nearest_section_replaces_the_one_it_inherits_whole(tmp_path, monkeypatch):
    """A tuned file may start from another GPU's (`defaults: [h100_sxm, _self_]`, as h200.yaml
    does), and Hydra merges mappings key by key: a `nearest:` key the parent's fit wrote and the
    child's did not (`regions`, written only where a dispatcher keeps the sides apart;
    `waves_cap`, only when not 0) would leak into the child's model. The child's own section is
    taken whole; a child without one (gh200.yaml, h100_pcie.yaml) runs the parent's. Composed
    through Hydra from a copy of conf/ with three small tuned files."""
    import shutil

    import yaml

    from src.job import config

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    parent = {"count": 4, "weighting": "equal", "waves": 0.5, "waves_cap": 2.0, "regions": ["min(m, n) <= 2"]}
    own = {"count": 3, "weighting": "inverse_distance", "waves": 0.0}
    for name, data in (("parent", {"nearest": parent}),
                       ("child", {"defaults": ["parent", "_self_"], "nearest": own}),
                       ("heir", {"defaults": ["parent", "_self_"], "kernels": {}})):
        (conf / "tuned" / f"{name}.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(config, "CONF_DIR", conf)
    config.forget()
    try:
        assert config.tuned_config("child")["nearest"] == own  # no `regions`, no `waves_cap`
        assert config.tuned_config("heir")["nearest"] == parent
        assert config.tuned_config("parent")["nearest"] == parent
    finally:
        monkeypatch.undo()
        config.forget()
