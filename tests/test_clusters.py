"""The cluster capacity check (src/job/clusters.py): what clusters place at once on this card
against the datasheet's `cluster_blocks`, which the dispatch's wave fill counts."""

import pytest

from src.job import clusters
from src.job import gpu as gpu_mod

H100_FOUND = {2: 132, 4: 120, 8: 120}  # cuOccupancyMaxActiveClusters x size, an H100 80GB HBM3, 2026-12-02


def test_a_datasheet_that_gives_the_measured_counts_agrees():
    assert clusters.disagreement("h100_sxm", dict(H100_FOUND), H100_FOUND, 132) is None


def test_a_size_that_places_every_sm_may_go_unsaid():
    # clusters of 2 fill all 132 SMs: the fill counts sms where the datasheet says nothing
    assert clusters.disagreement("h100_sxm", {4: 120, 8: 120}, H100_FOUND, 132) is None


@pytest.mark.parametrize("datasheet,said", [({}, "nothing"), ({4: 120, 8: 128}, "{4: 120, 8: 128}")])
def test_a_datasheet_that_differs_is_one_paragraph_naming_the_rule_and_the_line(datasheet, said):
    text = clusters.disagreement("h200", datasheet, H100_FOUND, 132)
    assert text is not None and "\n" not in text
    assert text.startswith(f"conf/gpu/h200.yaml: cluster_blocks says {said}")
    assert "(rule: cluster_blocks is what clusters of each size place at once" in text
    assert "`cluster_blocks: {2: 132, 4: 120, 8: 120}`" in text


def test_the_probe_is_a_launch_of_one_block_an_sm_in_clusters_of_each_size():
    """What the driver is asked about is the launch the wave fill counts: gemm_tf32's cluster
    entry, one block an SM, each size a cluster of that many K slices (built on the CPU)."""
    from src.job.spec import KernelSpec

    for size in clusters.SIZES:
        spec = clusters.probe_spec("h100_sxm", size)
        assert isinstance(spec, KernelSpec), spec
        assert spec.cluster == size and spec.resident_ctas == 1
        assert spec.entry.startswith("gemm_tf32_cluster<")


def test_without_a_gpu_it_says_so_and_exits_1(capsys):
    if gpu_mod.driver_loadable():
        pytest.skip("a driver is here: the GPU test measures")
    assert clusters.main(["h100_sxm"]) == 1
    assert "cluster capacity not measured: no NVIDIA driver" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.smoke
def test_this_card_places_what_its_datasheet_says():
    """On the GPU box: the driver's counts are whole clusters within the SMs, and where the
    detected spec's datasheet gives cluster_blocks, they agree with it."""
    device = gpu_mod.detect()
    spec = gpu_mod.spec_for_device_name(device.name)
    if spec is None or not str(device.compute_capability).startswith("9"):
        pytest.skip(f"the probe is an sm_90a kernel; {device.name} is not a known Hopper spec")
    found = clusters.measured(spec.name)
    assert set(found) == set(clusters.SIZES)
    for size, blocks in found.items():
        assert blocks % size == 0 and size <= blocks <= spec.sms
    assert found[2] >= found[4] >= found[8]
    datasheet = gpu_mod.cluster_blocks(spec.name)
    if datasheet:
        assert clusters.disagreement(spec.name, datasheet, found, spec.sms) is None
