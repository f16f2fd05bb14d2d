"""Config composition: every kernel and GPU composes, overrides reach the right keys, and
`kernel=glob(*)` sweeps every kernel config, baselines included."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.job import dispatch
from tests.conftest import CONF_DIR

KERNEL_CONFIGS = sorted(p.stem for p in (CONF_DIR / "kernel").glob("*.yaml"))
GPU_CONFIGS = sorted(p.stem for p in (CONF_DIR / "gpu").glob("*.yaml"))


def test_the_expected_kernels_exist():
    chapters = ["01_naive", "02_gmem_coalesce", "03_smem_blocking", "04_blocktile_1d",
                "05_blocktile_2d", "06_vectorize", "07_bank_linearize", "08_bank_padding",
                "09_autotuned", "10_warptiling", "11_double_buffer", "12_cp_async",
                "13_transpose_a", "14_swizzle", "15_coalesced_store", "16_register_double_buffer",
                "17_flagship", "18_wmma_tf32", "19_mma_tf32", "20_wgmma_tf32", "21_ffma_hopper",
                "22_ffma_warp_specialized", "23_wgmma_3xtf32", "24_ffma_skinny",
                "25_wgmma_tf32_any_shape"]
    library = ["gemm_3xtf32", "gemm_ffma", "gemm_ffma_narrow", "gemm_ffma_skinny", "gemm_mma_3xtf32",
               "gemm_mma_tf32", "gemm_tf32", "gemm_tf32_swapped"]
    peers = ["triton_fp32", "triton_tf32", "triton_tf32x3"]
    assert KERNEL_CONFIGS == (chapters + ["best_fp32", "best_tf32", "cublas_fp32", "cublas_tf32",
                                          "cutlass_3xtf32"] + library + peers)


@pytest.mark.parametrize("kernel", KERNEL_CONFIGS)
def test_kernel_config_composes(compose, kernel):
    cfg = compose(f"kernel={kernel}")
    assert cfg.kernel.name == kernel
    assert cfg.kernel.backend in ("nvrtc", "cublas", "dispatch", "triton", "cutlass")
    assert cfg.kernel.precision in ("fp32", "tf32")
    if cfg.kernel.backend == "dispatch":  # best_*: portable defaults, rules per GPU
        assert cfg.kernel.dispatch
        for entry in dispatch.defaults(OmegaConf.to_container(cfg.kernel, resolve=True)):
            default = OmegaConf.load(CONF_DIR / "kernel" / f"{entry['kernel']}.yaml")
            rules = [c.rule for c in default.get("constraints", [])]
            # built for the GPU's own architecture, or refused by rule where that cannot run it
            assert default.get("arch") is None or "compute_capability == 90" in rules, entry
            assert default.precision == "fp32" or cfg.kernel.precision == "tf32", entry  # no less accurate
    if cfg.kernel.backend == "nvrtc":
        assert (CONF_DIR.parent / "kernels" / cfg.kernel.source).is_file()
        if cfg.kernel.get("library"):  # kernels/gemm/<name after gemm_>.cu, or another build of
            # a library kernel's file (gemm_mma_3xtf32: mma_tf32.cu with PRODUCTS 3)
            source = cfg.kernel.source
            assert source == f"gemm/{kernel.removeprefix('gemm_')}.cu" or \
                (source.startswith("gemm/") and
                 (CONF_DIR / "kernel" / f"gemm_{Path(source).stem}.yaml").is_file())
        else:  # chapter number = file number
            assert cfg.kernel.source.startswith(f"chapters/{kernel[:2]}_")
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


@pytest.mark.parametrize("gpu", GPU_CONFIGS)
def test_gpu_config_composes(compose, gpu):
    cfg = compose(f"gpu={gpu}")
    assert cfg.gpu.name == gpu
    if gpu != "auto":
        for key in ("sms", "fp32_tflops", "tf32_tflops", "mem_bandwidth_gbs", "match"):
            assert cfg.gpu[key], (gpu, key)
        assert cfg.gpu.tf32_tflops > cfg.gpu.fp32_tflops or gpu == "rtx4090"


def test_required_gpus_are_described():
    assert {"h100_sxm", "h200", "gh200", "a100", "a6000", "rtx4090", "auto"} <= set(GPU_CONFIGS)


def test_size_sets_m_n_k_and_rectangular_overrides(compose):
    cfg = compose("size=1024")
    assert (cfg.m, cfg.n, cfg.k) == (1024, 1024, 1024)
    cfg = compose("size=1024", "m=256", "k=512")
    assert (cfg.m, cfg.n, cfg.k) == (256, 1024, 512)
    cfg = compose("alpha=0.5", "beta=3.0")
    assert (cfg.alpha, cfg.beta) == (0.5, 3.0)


def test_tile_parameters_and_protocol_override_from_command_line(compose):
    cfg = compose("kernel=05_blocktile_2d", "kernel.params.bk=16", "bench.flush_l2=false",
                  "bench.min_samples=50")
    assert cfg.kernel.params.bk == 16
    assert cfg.bench.flush_l2 is False and cfg.bench.min_samples == 50


def test_unknown_parameter_is_refused(compose):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose("kernel=05_blocktile_2d", "kernel.params.not_a_param=3")


def test_glob_sweeps_every_kernel_config():
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
    parser = OverridesParser.create(config_loader=loader)
    (override,) = parser.parse_overrides(["kernel=glob(*)"])
    assert sorted(override.sweep_string_iterator()) == KERNEL_CONFIGS


def test_bench_protocol_defaults_are_sane(compose):
    bench = compose().bench
    assert bench.flush_l2 is True
    assert 1 <= bench.min_samples <= bench.max_samples
    assert bench.tolerance.fp32 < bench.tolerance.tf32 <= 1e-2


@pytest.mark.parametrize("device_name,spec", [
    ("NVIDIA H100 80GB HBM3", "h100_sxm"), ("NVIDIA H100 PCIe", "h100_pcie"),
    ("NVIDIA H200", "h200"), ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA RTX A6000", "a6000"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("Tesla T4", None),
])
def test_auto_picks_the_spec_of_the_detected_device(device_name, spec):
    from src.job.gpu import Device, resolve_spec

    device = Device(name=device_name, compute_capability="9.0", sms=99,
                    max_threads_per_block=1024, max_smem_per_block=232448, l2_bytes=1 << 20)
    found = resolve_spec({"name": "auto"}, device)
    assert found.name == (spec or "unknown")
    if spec is None:
        assert found.peak_tflops("fp32") is None and found.sms == 99  # no invented peak


def test_isolation_and_tracking_are_config_groups(compose):
    """isolation and mlflow are picked by name from conf/isolation/ and conf/mlflow/, and their
    keys still take overrides; the defaults are a worker process and the local store."""
    default = compose()
    assert (default.isolation.mode, default.mlflow.enabled) == ("process", True)
    picked = compose("isolation=inline", "mlflow=off", "isolation.timeout_s=7")
    assert (picked.isolation.mode, picked.isolation.timeout_s) == ("inline", 7)
    assert picked.mlflow.enabled is False and picked.mlflow.tracking_uri is None
    server = compose("mlflow=server")
    assert server.mlflow.enabled is True
    with pytest.raises(Exception, match="isolation"):
        compose("isolation=no_such_mode")


# --- config files read once per process (src/compose/cache.py) ---------------------------------

def test_a_config_kept_across_composes_is_never_shared_between_them():
    """The second compose of a job is intact however the first one's config was changed
    (Hydra puts the nodes it loads into the config it composes, the primary config's without a
    copy): each compose gets its own copy of a kept file, never the kept nodes."""
    from omegaconf import open_dict

    from src.compose import rules as compose_rules
    from tests.conftest import compose_config

    def job():
        return compose_config("kernel=04_blocktile_1d", return_hydra_config=True)

    def plain(cfg):
        return OmegaConf.to_container(cfg, resolve=False)

    compose_rules.install()  # as src.run does: config files are kept from here on
    fresh = plain(job())
    first = job()
    with open_dict(first):
        first.alpha = 99.0  # from config.yaml, the primary config
        first.hydra.sweep.dir = "changed"
        first.hydra.callbacks.progress._target_ = "changed"
        first.kernel.launch.grid.append("extra")  # from conf/kernel/, the kernel's own file
        first.kernel.launch.grid[0] = "changed"
        first.kernel.name = "changed"
    second = job()
    assert plain(second) == fresh
    assert second.kernel.launch.grid._get_parent() is second.kernel.launch
    OmegaConf.merge(first, second).kernel.launch.grid.append("more")  # mixed: neither changes
    assert plain(job()) == fresh


def test_a_kept_config_edited_on_disk_is_read_again_and_checked_on_every_compose(tmp_path):
    from src.compose import rules as compose_rules
    from tests.conftest import compose_config

    compose_rules.install()
    folder = tmp_path / "conf" / "kernel"
    folder.mkdir(parents=True)
    mine = folder / "mine.yaml"
    mine.write_text("name: mine\nsource: a.cu\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    assert compose_config(searchpath, "kernel=mine").kernel.source == "a.cu"
    mine.write_text("name: mine\nsource: bb.cu\n")  # another size: read again even within a tick
    assert compose_config(searchpath, "kernel=mine").kernel.source == "bb.cu"
    mine.write_text("name: mine\nsource: ${oc.env:HOME}\n")
    for _ in range(2):  # refused each time, not only when first read
        with pytest.raises(compose_rules.ConfigRefused, match="rule: a kernel config is data"):
            compose_config(searchpath, "kernel=mine")
