"""The GPU-box tools in benchmarks/ on a CPU machine: at most six scripts, each in the README's
table and none reaching into sys.path; each Python one runs as a module and parses its arguments,
the SASS tool counts instructions from cuobjdump's text and builds what a run prepares, and
proof.sh refuses a chapter it cannot name."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from src.job.nvcc import nvcc_path
from tests.conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
MAX_SCRIPTS = 6  # issue 34: what a GPU-box user needs, no past issue's acceptance script


def scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.rglob("*") if p.suffix in (".py", ".sh")
                  and p.name != "__init__.py" and "__pycache__" not in p.parts)


TOOLS = sorted(name.removesuffix(".py") for name in scripts() if name.endswith(".py"))

# cuobjdump --dump-sass as it prints: an address, an optional predicate, the opcode, operands,
# then the encoding in a comment; the last addresses past 0xffff (a long kernel).
SASS = """
        code for sm_90a
                Function : _Z4gemmILi128EEvPKfS1_Pfiiiff
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
                                                                            /* 0x000fe40000000800 */
        /*0020*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   LDS.128 R8, [R0] ;
        /*0038*/                   LDSM.16.M88.4 R16, [R3] ;
        /*0040*/                   FFMA R12, R4, R8, R12 ;
        /*0050*/               @P2 FFMA.FTZ R13, R5, R9, R13 ;
        /*0060*/                   HGMMA.64x128x8.F32.TF32 R24, gdesc[UR4], R24 ;
        /*0070*/                   STL [R1], R12 ;
        /*10a40*/              @P1 STG.E [R2.64], R12 ;
        /*10a50*/                   EXIT ;
"""


def test_at_most_six_scripts_each_in_the_readme_table_without_sys_path():
    found = scripts()
    assert 0 < len(found) <= MAX_SCRIPTS, found
    readme = (BENCHMARKS / "README.md").read_text()
    table = readme[readme.index("| script |"):].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for name in found:
        module = f"python -m benchmarks.{name.removesuffix('.py')} "
        named = [row for row in rows if module in row or f"bash benchmarks/{name} " in row]
        assert len(named) == 1, f"{name}: {len(named)} rows of benchmarks/README.md's table name it"
        assert "sys.path" not in (BENCHMARKS / name).read_text(), name
    assert len(rows) == len(found), "a table row names a script that is gone"


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_runs_as_a_module_and_parses_arguments(tool):
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{tool}", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")


def test_ncu_stalls_refuses_without_a_size_or_ncu(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "OUT": str(tmp_path / "out")}  # no ncu on PATH
    for args, said in ((["17_flagship"], "invalid int value"),
                       (["4096", "17_flagship"], "ncu (Nsight Compute) is not on PATH")):
        done = subprocess.run([sys.executable, "-m", "benchmarks.ncu_stalls", *args],
                              capture_output=True, text=True, cwd=ROOT, env=env)
        assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_ncu_stalls_names_files_after_the_kernel_and_its_overrides():
    from benchmarks.ncu_stalls import overrides_of, tag_of

    assert tag_of("17_flagship:bk=16,stages=4") == "17_flagship_bk-16.stages-4"
    assert overrides_of("bk=16,stages=4") == {"bk": 16, "stages": 4} and overrides_of("") == {}
    assert re.fullmatch(r"[\w.-]+", tag_of("17_flagship:lane_map=2"))


def test_sass_counts_instructions():
    from benchmarks import sass

    math, memory = sass.instruction_counts(SASS)
    assert math == {"FFMA": 2, "HMMA": 0, "HGMMA": 1}
    assert memory == {"LDG.E.128": 1, "LDS.128": 1, "LDSM.16.M88.4": 1, "STL": 1, "STG.E": 1}
    ops = sass.OPCODE.findall(SASS)
    assert ops == ["LDC", "LDG", "LDS", "LDSM", "FFMA", "FFMA", "HGMMA", "STL", "STG", "EXIT"]


def test_sass_refuses_an_unknown_chapter_or_gpu():
    for args, said in ((["99_nope"], "no chapter 99_nope"), (["--gpu", "b300"], "--gpu must name"),
                       (["--hist"], "--hist needs a kernel name")):
        done = subprocess.run([sys.executable, "-m", "benchmarks.sass", *args],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2 and said in done.stderr, done.stderr


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (no CUDA toolkit)")
def test_sass_table_builds_what_a_run_prepares(tmp_path):
    """The table row of a chapter: ptxas's registers for the prepared kernel (built here with
    nvcc), and the counts of whatever cuobjdump prints (a stand-in here: this machine may have
    no cuobjdump)."""
    fake = tmp_path / "cuobjdump"
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + SASS + "EOF\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.sass", "06_vectorize",
                           "--size", "1024"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()[-2:]
    assert "h100_sxm, 1024" in header
    name, registers, ffma, hmma, hgmma, *memory = row.split()
    assert name == "06_vectorize" and 0 < int(registers) <= 255
    assert (ffma, hmma, hgmma) == ("2", "0", "1")
    assert " ".join(memory) == "LDG.E.128 x1, LDS.128 x1, LDSM.16.M88.4 x1, STG.E x1, STL x1"


@pytest.mark.parametrize("args,said", [([], "usage:"), (["99"], "exactly one chapter"),
                                       (["0"], "exactly one chapter"),
                                       (["23", "--size", "4"], "unknown argument '--size'")])
def test_proof_refuses_what_it_cannot_run(args, said):
    done = subprocess.run(["bash", str(BENCHMARKS / "proof.sh"), *args], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2 and said in done.stderr, done.stderr
