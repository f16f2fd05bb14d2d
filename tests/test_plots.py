"""Plots step on the recorded H100 runs: the three figures and their data files, the roofline's
arithmetic, and no failed job in any figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb

import src.publish.plots as plots
from src.records.collect import write_runs
from tests.runs_fixture import RUNS_FIXTURE, jsonl_jobs
from tests.test_table import CEILINGS_FIXTURE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# the published H100 run (dvc repro): every chapter, both precisions
PUBLISHED_RUNS = Path(__file__).resolve().parent.parent / "results" / "h100_sxm" / "runs.csv"


@pytest.fixture
def figures(monkeypatch):
    """Every figure the step draws, by file name, kept open for inspection."""
    drawn = {}

    def keep(fig, path):
        drawn[path.stem] = fig
        fig.savefig(path, dpi=40, metadata=plots.PNG_METADATA)  # smaller and faster in tests

    monkeypatch.setattr(plots, "_save", keep)
    yield drawn
    for fig in drawn.values():
        plots.plt.close(fig)


def texts(fig) -> str:
    """All the words in a figure: titles, tick labels, legends, annotations."""
    found = []
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        found += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        found += [t.get_text() for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            found += [t.get_text() for t in legend.get_texts()]
    return "\n".join(found)


def test_figures_and_data_files(tmp_path):
    data = plots.write_plots(RUNS_FIXTURE, CEILINGS_FIXTURE, tmp_path)
    for name in plots.FIGURES:
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
        assert len(pd.read_csv(tmp_path / f"{name}.csv")) == len(data[name])
    gflops = pd.read_csv(tmp_path / "gflops_vs_size.csv", dtype={"size_label": str})
    assert list(gflops.columns) == ["kernel", "math", "size_label", "size", "gflops"]
    assert len(gflops) == 16 and set(gflops["size"]) == {1024, 4096}
    pct = pd.read_csv(tmp_path / "pct_of_cublas.csv", dtype={"size_label": str})
    assert set(pct.size_label) == {"4096"} and len(pct) == 6  # the hand-written kernels
    assert pct.set_index("kernel").loc["06_vectorize", "pct_of_cublas_fp32"] == 62.77


def test_pngs_are_reproducible(tmp_path):
    """The same data gives byte-identical figures (no timestamps or versions in the PNG), so
    rerunning the stage on unchanged results changes nothing in git."""
    plots.write_plots(RUNS_FIXTURE, CEILINGS_FIXTURE, tmp_path / "a")
    plots.write_plots(RUNS_FIXTURE, CEILINGS_FIXTURE, tmp_path / "b")
    for name in plots.FIGURES:
        assert (tmp_path / "a" / f"{name}.png").read_bytes() == (tmp_path / "b" / f"{name}.png").read_bytes()


def test_reference_lines_and_size_axis(tmp_path, figures):
    plots.write_plots(RUNS_FIXTURE, CEILINGS_FIXTURE, tmp_path)
    ax = figures["gflops_vs_size"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"01_naive", "02_gmem_coalesce", "03_smem_blocking", "04_blocktile_1d",
                          "05_blocktile_2d", "06_vectorize", "cuBLAS FP32", "cuBLAS TF32"}
    assert lines["cuBLAS FP32"].get_linestyle() == "--"
    assert list(lines["cuBLAS TF32"].get_ydata()) == [117528.7, 406278.0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_roofline_intensity_and_ceilings(tmp_path, figures):
    # 2*N^3 FLOP over 4*3*N^2 bytes (A, B read once, C written once; beta = 0)
    assert plots.intensity(1024, 1024, 1024, 0.0) == pytest.approx(2 * 1024 / 12)
    assert plots.min_bytes(1024, 1024, 1024, 1.0) == 4 * 4 * 1024 * 1024  # C read as well
    data = plots.write_plots(RUNS_FIXTURE, CEILINGS_FIXTURE, tmp_path)
    roof = data["roofline"]
    assert set(roof.intensity) == {round(2 * 1024 / 12, 3), round(2 * 4096 / 12, 3)}
    ax = figures["roofline"].axes[0]
    measured = next(line for line in ax.get_lines() if "FFMA" in line.get_label())
    assert max(measured.get_ydata()) == pytest.approx(66900.0)
    # a stand-in is labelled as such, in the figure itself
    assert "NOT MEASURED" in measured.get_label()
    assert "ridge 20.0 FLOP/B" in texts(figures["roofline"])


def test_failed_jobs_are_in_no_figure(tmp_path, figures):
    """The mixed H100 sweep: 04_blocktile_1d bm=128 failed at every size, 04_blocktile_1d bm=64
    failed at 1000 and ran at 1024. Neither failure is drawn or listed anywhere."""
    write_runs(jsonl_jobs("records_h100_mixed.jsonl"), tmp_path / "runs.csv")
    data = plots.write_plots(tmp_path / "runs.csv", CEILINGS_FIXTURE, tmp_path / "plots")
    never = "04_blocktile_1d bm=128"
    for name, fig in figures.items():
        assert never not in texts(fig), name
        assert never not in set(data[name].kernel), name
    for points in data.values():
        assert len(points) == 3 and set(points.size_label) == {"1024"}  # the three ok jobs
    # a kernel that failed at one size and ran at another: a gap, not a point, at the failure
    ax = figures["gflops_vs_size"].axes[0]
    line = next(l for l in ax.get_lines() if l.get_label() == "04_blocktile_1d bm=64")
    assert list(line.get_xdata()) == [1024]  # size 1000 had no ok job at all
    assert not any(math.isnan(y) for y in line.get_ydata())


def test_gap_where_a_kernel_failed_between_sizes(tmp_path, figures):
    """Mark one real job failed the way the runner records a failure (status and error, no
    figures): its point disappears and the line breaks there instead of bridging it."""
    runs = pd.read_csv(RUNS_FIXTURE)
    frame = runs[runs.m != 1000].copy()
    extra = runs[(runs.kernel == "06_vectorize") & (runs.m == 4096)].copy()
    extra[["m", "n", "k", "size"]] = [8192, 8192, 8192, "8192"]
    frame = pd.concat([frame, extra])
    failed = (frame.kernel == "06_vectorize") & (frame.m == 4096)
    frame.loc[failed, "status"] = "failed_verification"
    frame.loc[failed, ["gflops", "pct_of_cublas_fp32", "pct_of_cublas_tf32"]] = np.nan
    frame.to_csv(tmp_path / "runs.csv", index=False)
    data = plots.write_plots(tmp_path / "runs.csv", CEILINGS_FIXTURE, tmp_path / "plots")
    ax = figures["gflops_vs_size"].axes[0]
    line = next(l for l in ax.get_lines() if l.get_label() == "06_vectorize")
    y = list(line.get_ydata())
    assert list(line.get_xdata()) == [1024, 4096, 8192] and math.isnan(y[1])
    assert not ((data["roofline"].kernel == "06_vectorize") & (data["roofline"].size_label == "4096")).any()
    # 8192 is the largest size, where only 06_vectorize has a row: the bar chart shows just it
    assert list(data["pct_of_cublas"].kernel) == ["06_vectorize"]


def test_nothing_to_plot_is_an_error(tmp_path):
    runs = pd.read_csv(RUNS_FIXTURE)
    runs = runs[runs.status != "ok"]
    runs.to_csv(tmp_path / "runs.csv", index=False)
    with pytest.raises(ValueError, match="nothing to plot .2 unsupported_size."):
        plots.write_plots(tmp_path / "runs.csv", CEILINGS_FIXTURE, tmp_path / "plots")
    assert not (tmp_path / "plots" / "roofline.png").exists()


def test_panels_keep_ffma_apart_from_the_tensor_cores_with_distinct_colours():
    """The published runs: 23 chapters and best_fp32 / best_tf32 in panels of at most ten, FFMA
    apart from the tensor-core ones (3xTF32 is FP32-accurate but not FFMA); within a panel no two
    kernels share a colour; the fastest hand-written kernel of each math at 8192, as the published
    table (progression.csv) reads, stands out."""
    ok = plots.plotted_rows(plots.progression_frame(plots.records_from_runs(plots.read_runs(PUBLISHED_RUNS))))
    table = pd.read_csv(PUBLISHED_RUNS.parent / "progression.csv")
    mine = table[(table.m == 8192) & ~table.kernel.str.startswith("cublas")]
    fastest = sorted(mine.loc[mine.groupby("math").gflops.idxmax(), "kernel"])
    assert len(fastest) == 3 and plots.headline_kernels(ok) == fastest
    maths = plots.math_of(ok)
    groups = plots.panels(ok)
    assert sorted(k for _, kernels in groups for k in kernels) == plots._mine(ok)
    for title, kernels in groups:
        assert len(kernels) <= plots.PANEL_SIZE
        colours = [tuple(to_rgb(s["color"])) for s in plots.series_styles(kernels).values()]
        assert len(set(colours)) == len(kernels)
        assert len({maths[k] == "ffma" for k in kernels}) == 1, title
    assert maths["23_wgmma_3xtf32"] == "3xtf32" and maths["22_ffma_warp_specialized"] == "ffma"


def test_every_figure_names_3xtf32_apart_from_ffma(tmp_path, figures):
    plots.write_plots(PUBLISHED_RUNS, CEILINGS_FIXTURE, tmp_path)
    for name in plots.FIGURES:
        assert "3xTF32" in texts(figures[name]) + figures[name].get_suptitle(), name
    roof = texts(figures["roofline"])
    assert "3xTF32 roof" in roof and "TF32 roof" in roof and "FFMA roof" in roof
    pct = texts(figures["pct_of_cublas"])
    assert "23_wgmma_3xtf32 [3xTF32]" in pct


def test_pct_of_cublas_compares_each_kernel_with_its_own_precision(tmp_path):
    data = plots.write_plots(PUBLISHED_RUNS, CEILINGS_FIXTURE, tmp_path)["pct_of_cublas"]
    for row in data.itertuples():
        same = row.pct_of_cublas_tf32 if row.precision == "tf32" else row.pct_of_cublas_fp32
        assert row.pct_of_cublas == same
    # no TF32 kernel against cuBLAS FP32 (700%): TF32 kernels stay near cuBLAS TF32
    assert data[data.precision == "tf32"].pct_of_cublas.max() < 150
    assert set(data.precision) == {"fp32", "tf32"}


@pytest.mark.parametrize("missing", ["runs", "ceilings"])
def test_plots_from_a_file_that_is_not_there_are_refused_with_the_rule(missing, tmp_path, capsys):
    """`python -m src.publish.plots` on a missing runs CSV or ceilings.json: argparse's one-line
    refusal naming what the file is and which step writes it (it was "error: [Errno 2] ..."), and
    nothing drawn."""
    paths = {"runs": tmp_path / "runs.csv", "ceilings": tmp_path / "ceilings.json"}
    write_runs(jsonl_jobs("records_h100_progression.jsonl"), paths["runs"])
    paths["ceilings"].write_text("{}")
    paths[missing] = tmp_path / "gone"
    with pytest.raises(SystemExit) as info:
        plots.main([str(paths["runs"]), "--ceilings", str(paths["ceilings"]), "--out-dir", str(tmp_path / "set")])
    assert info.value.code == 2 and not (tmp_path / "set").exists()
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gone'} is not a file (rule: " in err
    assert ("the bench stage collects" if missing == "runs" else "src.job.ceilings writes") in err
