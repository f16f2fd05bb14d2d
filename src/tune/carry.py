"""Tuning evidence carried over a kernel source change. A row of results/tuning/<gpu>.csv holds
for the source that measured it (`source_sha256`); a change to a kernel file (a parameter whose
new value alone runs new code, say) makes every row of that kernel another source's, and a
re-tune would measure them all again. A row still holds for today's source where its candidate,
at its shape, runs the same machine code with the same launch from both sources: then the GPU
ran what it would run today.

`sgemm-lab tune --carry-over REV` checks that for every row whose source is not today's but
REV's: it builds each such candidate at its shape from REV's kernels and kernel configs (a
temporary git worktree) and from today's, with nvcc for the kernel's architecture, and compares
their identity (`identity`): what the cubin holds of the entry's and the pre-pass's functions
(code, kernel attributes with their register counts and stacks, parameter bank, static shared
memory, relocations) and the launch (grid, block, dynamic shared memory, workspace, tensor maps,
the pre-pass's grid and block), names aside: a new template parameter renames the entry, and a
pre-pass built beside it but not launched moves the symbols' indices. A row whose identity agrees is
carried over: today's source hash, its params completed with the values today's config gives a
parameter the row's source did not have (so it names today's candidate), and `carried_from`
set to the source that measured it. Any other row is left as it was, another source's: a
re-tune (`--missing`, `--kernels`) measures it again.

Builds go through nvcc, not NVRTC: the same front end and ptxas, on any machine with the
toolkit, no GPU (src/job/nvcc.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from src.errors import ConfigError
from src.tune.space import kernel_identity

# The per-function sections of a cubin that make up what a launch of that function runs (its
# static shared memory is a NOBITS section: its size counts).
FUNCTION_SECTIONS = (".text.", ".nv.info.", ".nv.constant0.", ".rela.text.", ".rel.text.")
# .nv.info attributes (EIATTR_*) whose value starts with a symbol's index: CTAIDZ_USED,
# SYNC_STACK, PARAM_CBANK, FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE, REGCOUNT. An index moves
# when the cubin holds another function too (a pre-pass built but not launched): it is read as
# the symbol it names, the function's own name as its role.
SYMBOL_FIRST = {0x04, 0x09, 0x0a, 0x11, 0x12, 0x23, 0x2f}
IDENTITY_SCHEME = 2  # what _functions reads: a kept build of another scheme is not reused


def _records(data: bytes):
    """The (format, attribute, value) records of an .nv.info section."""
    import struct

    at = 0
    while at + 4 <= len(data):
        fmt, attr = data[at], data[at + 1]
        if fmt == 0x04:  # EIFMT_SVAL: a 16-bit size, then the value
            size = struct.unpack_from("<H", data, at + 2)[0]
            yield fmt, attr, data[at + 4:at + 4 + size]
            at += 4 + size
        else:  # EIFMT_NVAL, _BVAL, _HVAL: the value in the record's last two bytes
            yield fmt, attr, data[at + 2:at + 4]
            at += 4


def _functions(cubin: Path, roles: dict[str, str]) -> bytes:
    """What the cubin holds of the functions `roles` names ({role: function name, C linkage or
    C++ with any template arguments}), with each function's own name and every symbol index
    read as the role or the symbol's name: code, attributes, parameter bank, relocations, static
    shared memory."""
    import struct

    from elftools.elf.elffile import ELFFile

    def named(symbol: str, name: str) -> bool:
        return symbol == name or symbol.startswith(f"_Z{len(name)}{name}")

    with cubin.open("rb") as handle:
        elf = ELFFile(handle)
        symbols = [sym.name for sym in elf.get_section_by_name(".symtab").iter_symbols()]
        mangled = {role: next((s for s in symbols if named(s, name)), None)
                   for role, name in roles.items()}
        for role, symbol in mangled.items():
            if symbol is None:
                raise ConfigError(f"the cubin holds no function {roles[role]!r} (rule: a "
                                  f"candidate's identity is its {role}'s code); the build did not "
                                  f"instantiate it.")

        def neutral(name: str) -> str:
            for role, symbol in mangled.items():
                name = name.replace(symbol, f"<{role}>")
            return name

        def info(data: bytes, only: str | None = None) -> list:
            out = []
            for fmt, attr, value in _records(data):
                if attr in SYMBOL_FIRST and fmt == 0x04 and len(value) >= 4:
                    symbol = neutral(symbols[struct.unpack_from("<I", value)[0]])
                    if only is None or symbol == only:
                        out.append((attr, symbol, value[4:].hex()))
                elif only is None:
                    out.append((fmt, attr, value.hex()))
            return out

        parts = []
        for section in elf.iter_sections():
            if section.name == ".nv.info":  # the functions' register counts, stacks, frames
                parts += [repr((role, info(section.data(), f"<{role}>"))) for role in roles]
                continue
            for prefix in FUNCTION_SECTIONS + (".nv.shared.",):
                if not section.name.startswith(prefix) or \
                        neutral(section.name[len(prefix):]) not in {f"<{r}>" for r in roles}:
                    continue
                if prefix == ".nv.info.":
                    body = repr(info(section.data()))
                elif prefix.startswith(".rel"):
                    body = repr([(r["r_offset"], r["r_info_type"], r.entry.get("r_addend"),
                                  neutral(symbols[r["r_info_sym"]]))
                                 for r in section.iter_relocations()])
                elif prefix == ".nv.shared.":
                    body = str(section["sh_size"])
                else:
                    body = section.data().hex()
                parts.append(f"{neutral(section.name)} {body}")
    return "\n".join(sorted(parts)).encode()


def identity(spec, cache_dir: Path | None = None) -> str:
    """SHA-256 of what one launch of `spec` runs: its entry's and pre-pass's functions as nvcc
    builds them for the spec's architecture, and every launch setting; not their names. The
    build's part is kept in `cache_dir` (identities/), keyed by the exact source text, the entry
    names, the architecture and nvcc's version: a second evidence file's rows reuse it."""
    launch = (spec.grid, spec.block, spec.dynamic_smem_bytes, spec.workspace_bytes, spec.arch,
              spec.tensor_maps, spec.prepass.grid if spec.prepass else None,
              spec.prepass.block if spec.prepass else None) + ((spec.tail.grid,) if spec.tail else ())
    return hashlib.sha256((_code(spec, cache_dir) + repr(launch)).encode()).hexdigest()


def _code(spec, cache_dir: Path | None) -> str:
    from src.job.compile import expand_source
    from src.job.nvcc import compile_offline

    arch = spec.arch or "sm_90"
    prepass = spec.prepass.entry if spec.prepass else None
    tail = [spec.tail.entry] if spec.tail else []  # named only where there is one (keys stay)
    key = hashlib.sha256(json.dumps([IDENTITY_SCHEME, expand_source(spec.source), spec.entry,
                                     prepass, arch, _nvcc_version(), *tail]).encode()).hexdigest()
    memo = None if cache_dir is None else Path(cache_dir) / "identities" / key
    if memo is not None and memo.is_file():
        return memo.read_text()
    roles = {"entry": spec.entry.split("<")[0]}
    if prepass is not None:
        roles["prepass"] = prepass.split("<")[0]
    if tail:
        roles["tail"] = tail[0].split("<")[0]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "candidate.cubin"
        compile_offline(spec, arch, cubin=cubin)
        code = hashlib.sha256(_functions(cubin, roles)).hexdigest()
    if memo is not None:
        from src.job.file_lock import write_atomically

        memo.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(memo, code)
    return code


@functools.lru_cache(maxsize=1)
def _nvcc_version() -> str:
    from src.job.toolchain import nvcc_path

    path = nvcc_path()
    if path is None:
        return ""
    return subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()


def identities(rows: list[dict], gpu_spec: str, cache_dir: Path | None = None,
               threads: int | None = None) -> list[str | None]:
    """Each row's candidate identity at its shape, in this tree (None: its rules refuse it here);
    each distinct build once, on `threads` CPU threads (its code kept in `cache_dir`)."""
    from src.job.gpu import limits_from_spec
    from src.job.problem import Problem
    from src.tune import plan
    from src.tune import space as tune

    limits = limits_from_spec(gpu_spec)
    configs: dict = {}
    specs = []
    for r in rows:
        key = (r["kernel"], r["precision"])
        if key not in configs:
            configs[key] = plan.candidate_config(*key)
        params = r["params"] if isinstance(r["params"], dict) else json.loads(r["params"])
        verdict = tune.check(configs[key], params, Problem(int(r["m"]), int(r["n"]), int(r["k"]),
                                                           float(r["alpha"]), float(r["beta"])),
                             limits)
        specs.append(None if isinstance(verdict, str) else verdict)
    builds = {}
    for spec in specs:
        if spec is not None:
            builds.setdefault(_build_key(spec), spec)
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        built = dict(zip(builds, pool.map(lambda spec: identity(spec, cache_dir), builds.values())))
    return [None if s is None else built[_build_key(s)] for s in specs]


def _build_key(spec) -> tuple:
    """One build and launch: the source and what the tuner counts as one kernel (its entry and
    every launch setting)."""
    return spec.source, kernel_identity(spec)


def completed_params(row: dict, config: dict, space: dict) -> str:
    """The row's params with each parameter of today's tune space it lacks at the value today's
    kernel config gives it (what the row's source ran without naming it), as a params key."""
    params = json.loads(row["params"])
    for name in space:
        if name not in params and name in (config.get("params") or {}):
            params[name] = config["params"][name]
    return json.dumps(params, sort_keys=True)


def _identities_in(tree: Path, rows: list[dict], gpu_spec: str,
                   cache_dir: Path | None) -> list[str | None]:
    """identities() run by the code and configs of `tree` (a subprocess there)."""
    with tempfile.TemporaryDirectory() as tmp:
        given, taken = Path(tmp) / "rows.json", Path(tmp) / "identities.json"
        given.write_text(json.dumps({"gpu_spec": gpu_spec, "rows": rows,
                                     "cache_dir": None if cache_dir is None else str(cache_dir)}))
        proc = subprocess.run([sys.executable, "-m", "src.tune.carry", str(given), str(taken)],
                              cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ConfigError(f"building the candidates in {tree} failed (rule: a carried-over row "
                              f"is compared build for build):\n{proc.stderr.strip()[-2000:]}")
        return json.loads(taken.read_text())


def _tree_at(root: Path, rev: str, where: Path) -> None:
    """At `where`, today's code and configs (`root`'s src/ and conf/) with REV's kernels/ and
    kernel configs: today's code building REV's kernels as REV configured them."""
    import shutil

    proc = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=root,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"--carry-over {rev}: not a commit of {root} ({proc.stderr.strip()}) "
                          f"(rule: REV is the commit whose kernels measured the rows).")
    for folder in ("src", "conf"):
        shutil.copytree(root / folder, where / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(where / "conf" / "kernel")
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "kernels", "conf/kernel"],
                             cwd=root, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)


def carry_over(rows: list[dict], rev: str, gpu_spec: str, root: Path,
               cache_dir: Path | None = None) -> tuple[list[dict], dict]:
    """(the rows with those that hold for today's source carried over, {kernel: (carried, left)})
    for the rows whose source is not today's (counted as left where REV did not have it either);
    rows of today's source come back as they were. Builds are kept in `cache_dir`."""
    from src.tune import evidence, plan

    settings = plan.load_settings()
    today = {k: evidence.source_sha256(k) for k in {r["kernel"] for r in rows}}
    stale = [i for i, r in enumerate(rows) if r.get("source_sha256") != today[r["kernel"]]]
    if not stale:
        return rows, {}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        _tree_at(root, rev, where)
        then = _sources_in(where, sorted({rows[i]["kernel"] for i in stale}))
        from_rev = [i for i in stale if rows[i].get("source_sha256") == then[rows[i]["kernel"]]]
        asked = [_build_row(rows[i], settings) for i in from_rev]
        old = _identities_in(where, asked, gpu_spec, cache_dir) if asked else []
    configs = {k: plan.candidate_config(k, "fp32") for k in {rows[i]["kernel"] for i in from_rev}}
    spaces = {k: plan.kernel_space(k) for k in configs}
    renamed = {i: completed_params(rows[i], configs[rows[i]["kernel"]], spaces[rows[i]["kernel"]])
               for i in from_rev}
    new = identities([{**_build_row(rows[i], settings), "params": renamed[i]} for i in from_rev], gpu_spec,
                     cache_dir)
    out = [dict(r) for r in rows]
    for i, before, after in zip(from_rev, old, new):
        r = out[i]
        if before is not None and before == after:
            r.update(params=renamed[i], carried_from=r["source_sha256"],
                     source_sha256=today[r["kernel"]])
            if r.get("same_as"):
                r["same_as"] = completed_params({"params": r["same_as"]}, configs[r["kernel"]],
                                                spaces[r["kernel"]])
    dropped = _twins_apart(out, rows)
    report: dict = {}
    for i in stale:
        carried, left = report.get(rows[i]["kernel"], (0, 0))
        moved = i not in dropped and out[i].get("source_sha256") == today[rows[i]["kernel"]]
        report[rows[i]["kernel"]] = (carried + moved, left + (not moved))
    return [r for i, r in enumerate(out) if i not in dropped], report


def _twins_apart(out: list[dict], rows: list[dict]) -> set[int]:
    """A same_as row and its source row were one build at REV; where today's code carries one of
    them over and not the other, they are two builds today. A twin carried whose source row was
    not goes back as it was (the file keeps each twin beside its source). A twin not carried whose
    source row was is dropped: its figures are its source's launch, which it no longer builds, so
    it is measured again (`--missing`). Returns the indices dropped."""
    def key(r: dict, params: str) -> tuple:
        return (r["dispatcher"], r["shape"], r["kernel"], params)

    def moved(i: int) -> bool:
        return out[i].get("source_sha256") != rows[i].get("source_sha256")

    source_of = {key(r, r["params"]): j for j, r in enumerate(rows) if not r.get("same_as")}
    dropped = set()
    for i, r in enumerate(rows):
        j = source_of.get(key(r, r["same_as"])) if r.get("same_as") else None
        if j is None or moved(i) == moved(j):
            continue
        if moved(i):
            out[i] = dict(rows[i])
        else:
            dropped.add(i)
    return dropped


def _build_row(r: dict, settings: dict) -> dict:
    """What identities() needs of an evidence row: its candidate and problem (the tune's α, β)."""
    return {"kernel": r["kernel"], "precision": r["precision"], "params": r["params"],
            "m": r["m"], "n": r["n"], "k": r["k"], "alpha": settings["alpha"],
            "beta": settings["beta"]}


def _sources_in(tree: Path, kernels: list[str]) -> dict[str, str]:
    """{kernel: the SHA-256 of its source as NVRTC builds it} in `tree`."""
    code = ("import json, sys\nfrom src.tune.evidence import source_sha256\n"
            f"print(json.dumps({{k: source_sha256(k) for k in {kernels!r}}}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"reading the kernel sources in {tree} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    """`python -m src.tune.carry ROWS.json OUT.json`: the identities of ROWS (as identities())
    in this tree, for a carry-over run from another tree."""
    given, taken = Path(argv[0]), Path(argv[1])
    data = json.loads(given.read_text())
    cache_dir = data.get("cache_dir")
    taken.write_text(json.dumps(identities(data["rows"], data["gpu_spec"],
                                           None if cache_dir is None else Path(cache_dir))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
