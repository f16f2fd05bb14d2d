"""Kernel specs: constraints are checked before compiling, and each violation names its rule.

VIOLATIONS lists, for every constraint of every kernel config, parameters and a size that break
that rule; `test_every_constraint_has_a_violation_case` fails when a new rule has no case here.
"""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from src.errors import ConfigError, InvalidParams, InvalidProblem, UnsupportedSize
from src.job.gpu import limits_from_spec
from src.job.problem import Problem
from src.job.expression import ceil_div
from src.job.spec import build_spec
from tests.conftest import CONF_DIR, chapter_shapes

H100 = limits_from_spec("h100_sxm")
SQUARE = Problem(4096, 4096, 4096, 1.0, 0.0)


def kernel_cfg(name: str, **params) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml"))
    cfg.setdefault("params", {}).update(params)
    return cfg


# (kernel, params, problem, the rule that must be named)
VIOLATIONS = [
    ("01_naive", dict(block_x=64, block_y=32), SQUARE, "threads <= max_threads_per_block"),
    ("01_naive", dict(block_x=5, block_y=5), SQUARE, "threads % 32 == 0"),
    ("01_naive", dict(block_x=32, block_y=1), Problem(32, 70000, 32, 1, 0), "ceil_div(n, block_y) <= 65535"),
    ("02_gmem_coalesce", dict(bs=64), SQUARE, "threads <= max_threads_per_block"),
    ("02_gmem_coalesce", dict(bs=6), SQUARE, "threads % 32 == 0"),
    ("02_gmem_coalesce", dict(bs=8), Problem(8, 600000, 8, 1, 0), "ceil_div(n, bs) <= 65535"),
    ("03_smem_blocking", dict(bs=64), SQUARE, "threads <= max_threads_per_block"),
    ("03_smem_blocking", dict(bs=6), SQUARE, "threads % 32 == 0"),
    ("03_smem_blocking", dict(bs=32), Problem(1000, 1024, 1024, 1, 0), "m % bs == 0"),
    ("04_blocktile_1d", dict(tm=3), SQUARE, "bm % tm == 0"),
    ("04_blocktile_1d", dict(bm=128, bn=128, tm=8), SQUARE, "threads <= max_threads_per_block"),
    ("04_blocktile_1d", dict(bm=8, bn=4, tm=2), SQUARE, "threads % 32 == 0"),
    ("04_blocktile_1d", dict(bk=4), SQUARE, "(bm * bk) % threads == 0"),
    ("04_blocktile_1d", dict(bk=256, bm=256, bn=32, tm=16), SQUARE, "smem_bytes <= 48 * 1024"),
    ("04_blocktile_1d", dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ("05_blocktile_2d", dict(tm=3), SQUARE, "bm % tm == 0"),
    ("05_blocktile_2d", dict(bm=256, bn=256, tm=4, tn=8), SQUARE, "threads <= max_threads_per_block"),
    ("05_blocktile_2d", dict(bm=32, bn=32, tm=8, tn=8), SQUARE, "threads % 32 == 0"),
    ("05_blocktile_2d", dict(bk=1), SQUARE, "(bm * bk) % threads == 0"),
    ("05_blocktile_2d", dict(bk=64), SQUARE, "smem_bytes <= 48 * 1024"),
    ("05_blocktile_2d", dict(tm=16, tn=16, bm=256, bn=256), SQUARE, "tm * tn <= 128"),
    ("05_blocktile_2d", dict(), Problem(1000, 1000, 1000, 1, 0), "m % bm == 0"),
    ("06_vectorize", dict(tm=12), SQUARE, "bm % tm == 0"),
    ("06_vectorize", dict(tm=2, tn=2, bm=32, bn=64), SQUARE, "tm % 4 == 0"),
    ("06_vectorize", dict(bm=256, bn=128, tm=4, tn=4), SQUARE, "threads <= max_threads_per_block"),
    ("06_vectorize", dict(bm=16, bn=16, tm=4, tn=4), SQUARE, "threads % 32 == 0"),
    ("06_vectorize", dict(bk=4), SQUARE, "(bm * bk) % (4 * threads) == 0"),
    ("06_vectorize", dict(bk=64), SQUARE, "smem_bytes <= 48 * 1024"),
    ("06_vectorize", dict(tm=16, tn=16, bm=256, bn=256, bk=16), SQUARE, "tm * tn <= 128"),
    ("06_vectorize", dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ("06_vectorize", dict(bm=64, bn=64, bk=16, tm=4, tn=4), Problem(128, 130, 128, 1, 0), "m % bm == 0"),
] + [
    # 07-09 share 06's rules (09 is 08's kernel, 08 is 07's with a padded A tile)
    (name, *case) for name in ("07_bank_linearize", "08_bank_padding", "09_autotuned") for case in [
        (dict(bm=256, bk=16, tm=12, tn=4), SQUARE, "bm % tm == 0"),
        (dict(bk=6), SQUARE, "tm % 4 == 0"),
        (dict(bm=256, bk=4, tm=4, tn=4), SQUARE, "threads <= max_threads_per_block"),
        (dict(bm=64, bn=96, tm=16), SQUARE, "threads % 32 == 0"),
        (dict(bn=256, bk=4), SQUARE, "(bm * bk) % (4 * threads) == 0"),
        (dict(bk=64, tm=4, tn=4), SQUARE, "smem_bytes <= 48 * 1024"),
        (dict(tm=16, tn=16, bm=256, bn=256, bk=16), SQUARE, "tm * tn <= 128"),
        (dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ]
] + [
    # the warp-tiled chapters share their warp/lane tiling rules
    (name, *case) for name in ("10_warptiling", "11_double_buffer", "12_cp_async", "17_flagship")
    for case in [
        (dict(wm=48, wniter=1, threads=128), SQUARE, "bm % wm == 0"),
        (dict(threads=512), SQUARE, "warps * 32 == threads"),
        (dict(tm=16, tn=8), SQUARE, "wmiter >= 1"),
        (dict(bn=96, wm=128, wn=24, wniter=1, threads=128), SQUARE, "wm % wmiter == 0"),
        (dict(bn=96, wm=128, wn=24, wniter=1, tm=12, threads=128), SQUARE, "wsubm % tm == 0"),
        (dict(bm=256, bn=256, bk=32, wm=32, wn=32, wniter=1, tm=4, tn=4, threads=2048), SQUARE, "threads <= max_threads_per_block"),
    ]
] + [
    ("10_warptiling", dict(bk=6), SQUARE, "tm % 4 == 0"),
    ("10_warptiling", dict(bk=64, wniter=1), SQUARE, "smem_bytes <= 48 * 1024"),
    ("10_warptiling", dict(bn=256, wm=128, wniter=1), SQUARE, "accumulators <= 128"),
    ("10_warptiling", dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ("11_double_buffer", dict(bk=6), SQUARE, "tm % 4 == 0"),
    ("11_double_buffer", dict(bm=256, bk=16, wn=64), SQUARE, "smem_bytes <= 48 * 1024"),
    ("11_double_buffer", dict(bk=12), SQUARE, "(bm * bk) % (4 * threads) == 0"),
    ("11_double_buffer", dict(bk=16, wn=64, tn=8, threads=128), SQUARE, "accumulators + (bm * bk + bk * bn) // threads <= 144"),
    ("11_double_buffer", dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ("12_cp_async", dict(bk=4, wniter=1, tm=16), SQUARE, "tn % 4 == 0 and bk % 8 == 0"),
    ("12_cp_async", dict(stages=1), SQUARE, "stages >= 2"),
    ("12_cp_async", dict(bm=64, bk=8, wm=32, tm=4), SQUARE, "(bm * bk) % (4 * threads) == 0"),
    ("12_cp_async", dict(bm=256, bk=64, wm=128), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("12_cp_async", dict(wm=128, threads=128), SQUARE, "accumulators + 4 * wmiter * tm <= 160"),
    ("12_cp_async", dict(), Problem(4096, 4096, 4104, 1, 0), "m % bm == 0"),
    ("17_flagship", dict(bk=12, wm=32, wn=64), SQUARE, "tn % 4 == 0 and bk % 8 == 0"),
    ("17_flagship", dict(stages=1), SQUARE, "stages >= 2"),
    ("17_flagship", dict(bm=256, bk=8, threads=512), SQUARE, "(bm * bk) % (vec * threads) == 0"),
    ("17_flagship", dict(bk=64, wniter=4, tm=4, stages=8), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("17_flagship", dict(ka=3), SQUARE, "ka == 2 or ka == 4"),
    ("17_flagship", dict(fma_order=5), SQUARE, "fma_order <= 4"),
    ("17_flagship", dict(wn=64, threads=128), SQUARE, "accumulators + ka * wmiter * tm <= 160"),
    ("17_flagship", dict(min_blocks=16), SQUARE, "threads * min_blocks <= 2048"),
    ("13_transpose_a", dict(), Problem(1000, 1024, 1024, 1, 0), "m % bm == 0"),
    ("14_swizzle", dict(), Problem(1000, 1024, 1024, 1, 0), "m % bm == 0"),
    ("15_coalesced_store", dict(), Problem(1000, 1024, 1024, 1, 0), "m % bm == 0"),
    ("16_register_double_buffer", dict(), Problem(1000, 1024, 1024, 1, 0), "m % bm == 0"),
    ("18_wmma_tf32", dict(wm=24), SQUARE, "wm % 16 == 0 and wn % 16 == 0 and bk % 8 == 0"),
    ("18_wmma_tf32", dict(bm=96), SQUARE, "bm % wm == 0"),
    ("18_wmma_tf32", dict(threads=128), SQUARE, "warps * 32 == threads"),
    ("18_wmma_tf32", dict(bm=64, bk=8, wm=32), SQUARE, "(bm * bk) % (4 * threads) == 0"),
    ("18_wmma_tf32", dict(bm=256, bn=256, wm=32, wn=32, threads=2048), SQUARE, "threads <= max_threads_per_block"),
    ("18_wmma_tf32", dict(bk=64), SQUARE, "smem_bytes <= 48 * 1024"),
    ("18_wmma_tf32", dict(wm=128, wn=64, threads=64), SQUARE, "fragments <= 16"),
    ("18_wmma_tf32", dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ("19_mma_tf32", dict(wm=24), SQUARE, "wm % 16 == 0 and wn % 8 == 0"),
    ("19_mma_tf32", dict(bk=16), SQUARE, "bk % 32 == 0 and bn % 32 == 0"),
    ("19_mma_tf32", dict(bm=96), SQUARE, "bm % wm == 0"),
    ("19_mma_tf32", dict(threads=128), SQUARE, "warps * 32 == threads"),
    ("19_mma_tf32", dict(bm=32, bn=64, wm=16, wn=8, threads=512), SQUARE, "(bm * bk) % (4 * threads) == 0"),
    ("19_mma_tf32", dict(stages=1), SQUARE, "stages >= 2"),
    ("19_mma_tf32", dict(bm=256, bn=256, wm=32, wn=32, threads=2048), SQUARE, "threads <= max_threads_per_block"),
    ("19_mma_tf32", dict(stages=8), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("19_mma_tf32", dict(wm=128, wn=64, threads=64), SQUARE, "accumulators <= 128"),
    ("19_mma_tf32", dict(), Problem(4096, 4096, 4100, 1, 0), "m % bm == 0"),
    ("21_ffma_hopper", dict(bm=96), SQUARE, "bm % wm == 0 and bn % wn == 0"),
    ("21_ffma_hopper", dict(threads=128), SQUARE, "warps * 32 == threads"),
    ("21_ffma_hopper", dict(tm=8), SQUARE, "tm % 4 == 0 and tn % 4 == 0"),
    ("21_ffma_hopper", dict(stages=1), SQUARE, "stages >= 2 and bk % 2 == 0"),
    ("21_ffma_hopper", dict(bk=6), SQUARE, "threads % bk == 0"),
    ("21_ffma_hopper", dict(bm=512, bn=512, bk=32, wm=32, tm=8, threads=4096), SQUARE,
     "threads <= max_threads_per_block"),
    ("21_ffma_hopper", dict(stages=10), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("21_ffma_hopper", dict(tm=32, wm=128, threads=128), SQUARE, "accumulators + (tm + tn) * 2 <= 192"),
    ("21_ffma_hopper", dict(fma_order=4), SQUARE, "fma_order <= 3 and loads_first <= 2"),
    ("21_ffma_hopper", dict(min_blocks=16), SQUARE, "threads * min_blocks <= 2048"),
    ("22_ffma_warp_specialized", dict(bm=96), SQUARE, "bm % wm == 0 and bn % wn == 0"),
    ("22_ffma_warp_specialized", dict(bm=64, bn=128), SQUARE, "consumer_warps % 4 == 0"),
    ("22_ffma_warp_specialized", dict(tm=8), SQUARE, "tm % 4 == 0 and tn % 4 == 0"),
    ("22_ffma_warp_specialized", dict(stages=1), SQUARE, "stages >= 2 and bk % 2 == 0"),
    ("22_ffma_warp_specialized", dict(bk=6), SQUARE, "128 % bk == 0"),
    ("22_ffma_warp_specialized", dict(bm=256, bn=512), SQUARE, "threads <= max_threads_per_block"),
    ("22_ffma_warp_specialized", dict(stages=20), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("22_ffma_warp_specialized", dict(tm=32, wm=128), SQUARE, "accumulators + (tm + tn) * 2 <= 192"),
    ("22_ffma_warp_specialized", dict(fma_order=2), SQUARE, "fma_order == 1 or fma_order == 3"),
    ("22_ffma_warp_specialized", dict(sk_idle_pct=101), SQUARE, "sk_idle_pct <= 100"),
    ("22_ffma_warp_specialized", dict(split_k=2), SQUARE, "schedule == 1 or (schedule == 2 and split_k == 1)"),
    ("22_ffma_warp_specialized", dict(schedule=3, split_k=3), SQUARE, "schedule == 1 or (schedule == 2 and split_k == 1)"),
    ("22_ffma_warp_specialized", dict(schedule=3, split_k=8, bn=64, wm=32, wn=16, tm=4, tn=4), SQUARE,
     "schedule != 3 or accumulators % (4 * split_k) == 0"),
    ("20_wgmma_tf32", dict(bm=192), SQUARE, "bm == 128 or bm == 256"),
    ("20_wgmma_tf32", dict(bn=192), SQUARE, "bn == 64 or bn == 128"),
    ("20_wgmma_tf32", dict(in_flight=3), SQUARE, "in_flight == 1 or in_flight == 2"),
    ("20_wgmma_tf32", dict(stages=2), SQUARE, "stages >= in_flight + 1"),
    ("20_wgmma_tf32", dict(stages=5), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("20_wgmma_tf32", dict(), Problem(4096, 4098, 4096, 1, 0), "n % 4 == 0 and k % 4 == 0"),
    ("23_wgmma_3xtf32", dict(bm=192), SQUARE, "bm == 128 or bm == 256"),
    ("23_wgmma_3xtf32", dict(bn=256), SQUARE, "bn == 64 or bn == 128"),
    ("23_wgmma_3xtf32", dict(bm=256, stages=2, in_flight=1), SQUARE, "accumulators <= 128"),
    ("23_wgmma_3xtf32", dict(in_flight=3, stages=4), SQUARE, "in_flight == 1 or in_flight == 2"),
    ("23_wgmma_3xtf32", dict(stages=2, in_flight=2), SQUARE, "stages >= in_flight + 1"),
    ("23_wgmma_3xtf32", dict(order=3), SQUARE, "order == 1 or order == 2"),
    ("23_wgmma_3xtf32", dict(accumulation=3), SQUARE, "accumulation == 1 or accumulation == 2"),
    ("23_wgmma_3xtf32", dict(stages=5), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("24_ffma_skinny", dict(), SQUARE, "min(m, n) <= 32"),
    ("24_ffma_skinny", dict(warps=64), Problem(8, 4096, 4096, 1, 0),
     "warps >= 1 and 32 * warps <= max_threads_per_block"),
    ("24_ffma_skinny", dict(max_k_slice=32), Problem(8, 4096, 4096, 1, 0),
     "unroll >= 1 and (max_k_slice // k_step) >= 1"),
    ("24_ffma_skinny", dict(unroll=32), Problem(32, 4096, 4096, 1, 0),
     "accumulators + unroll * vec <= 192"),
    ("24_ffma_skinny", dict(max_k_slice=2048, blocks_per_sm=1), Problem(4096, 32, 8192, 1, 0),
     "smem_bytes <= max_smem_per_block"),
    ("25_wgmma_tf32_any_shape", dict(bm=192), SQUARE, "bm == 64 or bm == 128 or bm == 256"),
    ("25_wgmma_tf32_any_shape", dict(bn=256), SQUARE, "bn == 64 or bn == 128"),
    ("25_wgmma_tf32_any_shape", dict(in_flight=3, stages=4), SQUARE, "in_flight == 1 or in_flight == 2"),
    ("25_wgmma_tf32_any_shape", dict(stages=2, in_flight=2), SQUARE, "stages >= in_flight + 1"),
    ("25_wgmma_tf32_any_shape", dict(split_k=3), SQUARE, "split_k == 1 or split_k == 2"),
    ("25_wgmma_tf32_any_shape", dict(min_slice_k=16), SQUARE, "min_slice_k >= 32"),
    ("25_wgmma_tf32_any_shape", dict(min_slices=4, split_k=2), SQUARE, "min_slices >= 1 and min_slices <= split_k"),
    ("25_wgmma_tf32_any_shape", {}, Problem(4, 1, 2**31 - 1, 1, 0), "copy_chunks <= 2147483647"),
    ("25_wgmma_tf32_any_shape", dict(stages=2, in_flight=1), Problem(256, 128, 8192, 1, 0),
     "slices == 1 or stages * stage_bytes >= 4 * bm * bn"),
    ("25_wgmma_tf32_any_shape", dict(stages=5), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("gemm_3xtf32", dict(register_operand=3), SQUARE, "register_operand == 1 or register_operand == 2"),
    ("gemm_3xtf32", dict(bm=192), SQUARE, "wgmma_side == 64 or wgmma_side == 128 or wgmma_side == 256"),
    ("gemm_3xtf32", dict(bm=200, fit=2), SQUARE, "wgmma_side == 64 or wgmma_side == 128 or wgmma_side == 256"),
    ("gemm_3xtf32", dict(fit=3), SQUARE, "fit == 1 or fit == 2"),
    ("gemm_tf32", dict(fit=4), SQUARE, "fit == 1 or fit == 2 or fit == 3"),
    ("gemm_tf32", dict(unaligned_rows=3), SQUARE, "unaligned_rows == 1 or unaligned_rows == 2"),
    ("gemm_3xtf32", dict(unaligned_rows=3), SQUARE, "unaligned_rows == 1 or unaligned_rows == 2"),
    ("gemm_3xtf32", dict(split_by=3), SQUARE, "split_by == 1 or split_by == 2"),
    ("gemm_tf32_swapped", dict(bm=256), SQUARE, "bm == 64 or bm == 128"),
    ("gemm_tf32_swapped", dict(bn=256), SQUARE, "bn == 64 or bn == 128"),
    ("gemm_tf32_swapped", dict(fit=3), SQUARE, "fit == 1 or fit == 2"),
    ("gemm_tf32_swapped", dict(unaligned_rows=3), SQUARE, "unaligned_rows == 1 or unaligned_rows == 2"),
    ("gemm_tf32", dict(split_tail=2), SQUARE, "split_tail == 0 or split_tail == 1"),
    ("gemm_3xtf32", dict(split_tail=2), SQUARE, "split_tail == 0 or split_tail == 1"),
    ("gemm_tf32_swapped", dict(split_tail=2), SQUARE, "split_tail == 0 or split_tail == 1"),
    ("gemm_tf32_swapped", dict(in_flight=3, stages=4), SQUARE, "in_flight == 1 or in_flight == 2"),
    ("gemm_tf32_swapped", dict(stages=2, in_flight=2), SQUARE, "stages >= in_flight + 1"),
    ("gemm_tf32_swapped", dict(split_k=3), SQUARE, "split_k == 1 or split_k == 2"),
    ("gemm_tf32_swapped", dict(min_slice_k=16), SQUARE, "min_slice_k >= 32"),
    ("gemm_tf32_swapped", dict(stages=12, bn=128), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("gemm_tf32", dict(bm=72, fit=2), SQUARE, "bm == 64 or bm == 128 or bm == 256"),
    ("gemm_3xtf32", dict(bn=256), SQUARE, "register_side == 64 or register_side == 128"),
    ("gemm_3xtf32", dict(bm=256, stages=2), SQUARE, "accumulators <= 128"),
    ("gemm_3xtf32", dict(accumulation=3), SQUARE, "accumulation == 1 or accumulation == 2"),
    ("gemm_3xtf32", dict(in_flight=3, stages=4), SQUARE, "in_flight == 1 or in_flight == 2"),
    ("gemm_3xtf32", dict(stages=2, in_flight=2), SQUARE, "stages >= in_flight + 1"),
    ("gemm_3xtf32", dict(split_k=3), SQUARE, "split_k == 1 or split_k == 2"),
    ("gemm_3xtf32", dict(min_slice_k=16), SQUARE, "min_slice_k >= 32"),
    ("gemm_3xtf32", dict(stages=5), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("gemm_3xtf32", dict(register_operand=2, bm=256), SQUARE, "register_side == 64 or register_side == 128"),
    ("gemm_3xtf32", dict(register_operand=2, bn=256, accumulation=1), SQUARE, "a_in_registers == 0 or bn <= 128"),
    ("gemm_3xtf32", dict(register_operand=2, accumulation=3), SQUARE, "accumulation == 1 or accumulation == 2"),
    ("gemm_3xtf32", dict(register_operand=2, in_flight=3), SQUARE, "in_flight == 1 or in_flight == 2"),
    ("gemm_3xtf32", dict(register_operand=2, stages=2, in_flight=2), SQUARE, "stages >= in_flight + 1"),
    ("gemm_3xtf32", dict(register_operand=2, split_k=3), SQUARE, "split_k == 1 or split_k == 2"),
    ("gemm_3xtf32", dict(register_operand=2, min_slice_k=16), SQUARE, "min_slice_k >= 32"),
    ("gemm_3xtf32", dict(register_operand=2, stages=5), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("gemm_ffma", dict(bm=32, wm=64), SQUARE, "bm % wm == 0 and bn % wn == 0"),
    ("gemm_ffma", dict(tm=6), SQUARE, "tm % 4 == 0 and tn % 4 == 0"),
    ("gemm_ffma", dict(stages=1), SQUARE, "stages >= 2"),
    ("gemm_ffma", dict(bk=128), SQUARE, "threads % bk == 0"),
    ("gemm_ffma", dict(bm=1024, wm=16, bn=64, wn=64, tn=4, bk=64), Problem(1024, 1023, 1024, 1, 0),
     "threads <= max_threads_per_block"),
    ("gemm_ffma", dict(stages=30), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("gemm_ffma", dict(tm=16, tn=16, wm=64, wn=128, bn=128), SQUARE, "accumulators * (1 + prefetch_c) + tm + tn <= 192"),
    ("gemm_ffma", dict(c_read=3), SQUARE, "c_read == 1 or c_read == 2"),
    ("gemm_ffma", dict(min_slice_k=8), SQUARE, "blocks_per_sm >= 1 and min_slice_k >= bk"),
    ("gemm_ffma", dict(bm=128, bn=128, wm=64, wn=32), SQUARE, "bm * bn <= 8192"),
    ("gemm_mma_tf32", dict(bm=32, wm=64), SQUARE, "bm % wm == 0 and bn % wn == 0"),
    ("gemm_mma_tf32", dict(bm=48, wm=24), SQUARE, "wm % 16 == 0 and wn % 8 == 0 and bk % 8 == 0"),
    ("gemm_mma_tf32", dict(bk=24), SQUARE, "bn % 32 == 0 and (bk == 16 or bk % 32 == 0)"),
    ("gemm_mma_tf32", dict(stages=1), SQUARE, "stages >= 2"),
    ("gemm_mma_tf32", dict(bm=32, bn=32, wm=16, wn=8, bk=16), SQUARE, "(bm * bk) % (4 * threads) == 0"),
    ("gemm_mma_tf32", dict(bm=256, bn=128, wm=16, wn=32, bk=64), SQUARE, "threads <= max_threads_per_block"),
    ("gemm_mma_tf32", dict(stages=30), SQUARE, "smem_bytes <= max_smem_per_block"),
    ("gemm_mma_tf32", dict(wm=64, wn=64), SQUARE, "accumulators + 4 * c_groups <= 128"),
    ("gemm_mma_tf32", dict(min_slice_k=8), SQUARE, "blocks_per_sm >= 1 and min_slice_k >= bk"),
    # its 3xTF32 build holds a k tile's sums beside the total: TF32's largest warp tile breaks it
    ("gemm_mma_3xtf32", dict(wm=64, wn=32), SQUARE, "2 * accumulators + 4 * c_groups <= 128"),
]
# cp.async or TF32: refused on a GPU before sm_80 (tests/test_compile.py builds each for sm_75)
SM_80 = ("12_cp_async", "17_flagship", "18_wmma_tf32", "19_mma_tf32", "21_ffma_hopper", "gemm_ffma",
         "gemm_ffma_narrow", "gemm_mma_tf32", "gemm_mma_3xtf32")
# n % 4 alone: a size with n a multiple of bn but not of 4 needs bn odd, which tn % 4 forbids;
# the rule still guards rectangular sizes if the tile rules are ever relaxed.
# The same holds for the later chapters with tn % 4 (07-12) and for 18 and 19 (bn a multiple of 16 or 32). 17's counts are positive integers
# before any rule is checked (every tile parameter must be), so its `>= 1` rule is a second guard.
UNREACHABLE = {(name, "n % 4 == 0 and k % 4 == 0") for name in (
    "06_vectorize", "07_bank_linearize", "08_bank_padding", "09_autotuned", "10_warptiling",
    "11_double_buffer", "12_cp_async", "18_wmma_tf32", "19_mma_tf32")} | {
    ("17_flagship", "group_m >= 1 and split_k >= 1 and min_blocks >= 1"),
    ("21_ffma_hopper", "group_m >= 1 and split_k >= 1 and min_blocks >= 1"),
    ("20_wgmma_tf32", "group_m >= 1"),              # parameters are positive integers already
    ("20_wgmma_tf32", "compute_capability == 90"),  # H100 limits: test_sm90a_chapter_needs_hopper
    ("23_wgmma_3xtf32", "group_m >= 1"),
    ("23_wgmma_3xtf32", "compute_capability == 90"),
    ("22_ffma_warp_specialized", "compute_capability == 90"),
    ("22_ffma_warp_specialized", "group_m >= 1 and split_k >= 1 and sk_split >= 1"),
    ("25_wgmma_tf32_any_shape", "group_m >= 1"),
    ("25_wgmma_tf32_any_shape", "compute_capability == 90"),
    ("gemm_3xtf32", "group_m >= 1"),
    ("gemm_3xtf32", "compute_capability == 90"),
    # a 3xTF32 stage holds two tiles of the wgmma side and one of the register side: stages >= 2
    # gives 256 * (register_side + 2 * wgmma_n) bytes, more than the 4 * bm * bn of a partial
    # tile for every allowed bm and bn
    ("gemm_3xtf32", "slices == 1 or stages * stage_bytes >= 4 * block_m * block_n"),
    ("gemm_tf32", "group_m >= 1"),                  # as for chapter 25
    ("gemm_tf32_swapped", "group_m >= 1"),
    ("gemm_tf32_swapped", "compute_capability == 90"),
    # a stage holds A's bm rows and B_big^T's block_n: 128 * (bm + block_n) bytes, and stages >= 2,
    # at least the 4 * bm * block_n of a partial tile for every allowed bm and block_n
    ("gemm_tf32_swapped", "slices == 1 or stages * stage_bytes >= 4 * bm * block_n"),
    ("gemm_tf32", "compute_capability == 90"),
} | {(name, "compute_capability >= 80") for name in SM_80}  # H100 limits: test_cp_async_kernel_needs_sm_80
# The library's copies of chapters 24 and 25 keep their chapters' rules: the same cases break them.
# (gemm_tf32's ring rule counts its block_m, the rows bm or the rows `fit` 2 fitted to the shape.)
# (gemm_tf32's min_slices may also be 0: 2 K slices only where they shorten the waves.)
LIBRARY_RULE = {"slices == 1 or stages * stage_bytes >= 4 * bm * bn":
                "slices == 1 or stages * stage_bytes >= 4 * block_m * bn",
                "min_slices >= 1 and min_slices <= split_k": "min_slices >= 0 and min_slices <= split_k"}
VIOLATIONS += [(f"gemm_{name}", params, problem, LIBRARY_RULE.get(rule, rule) if name == "tf32" else rule)
               for name, chapter in (("tf32", "25_wgmma_tf32_any_shape"), ("ffma_skinny", "24_ffma_skinny"))
               for kernel, params, problem, rule in list(VIOLATIONS) if kernel == chapter]
# gemm_mma_3xtf32 is gemm_mma_tf32's file with three products a step: the same rules but the
# register budget (above), broken by the same cases.
VIOLATIONS += [("gemm_mma_3xtf32", params, problem, rule) for kernel, params, problem, rule in
               list(VIOLATIONS) if kernel == "gemm_mma_tf32" and "accumulators" not in rule]
VIOLATIONS += [
    ("gemm_ffma_narrow", dict(), SQUARE, "(m <= 32 and m < n) or (n <= 96 and n <= m)"),
    ("gemm_ffma_narrow", dict(), Problem(33, 4096, 4096, 1, 0), "(m <= 32 and m < n) or (n <= 96 and n <= m)"),
    ("gemm_ffma_narrow", dict(warps=64), Problem(8, 4096, 4096, 1, 0),
     "warps >= 1 and threads <= max_threads_per_block"),
    ("gemm_ffma_narrow", dict(staging=2, chunk=32, warps=8, warps_k=8), Problem(8, 4096, 4096, 1, 0),
     "warps >= 1 and threads <= max_threads_per_block"),  # 8 x 8 warps: 2,048 threads
    ("gemm_ffma_narrow", dict(staging=2, chunk=32, warps=4, warps_k=4), Problem(8, 4096, 4096, 1, 0),
     "threads <= 256"),  # 512 threads of up to 255 registers
    ("gemm_ffma_narrow", dict(staging=2, chunk=32, warps=1, warps_k=3), Problem(8, 4096, 4096, 1, 0),
     "warps_k == 1 or warps_k == 2 or warps_k == 4 or warps_k == 8"),
    ("gemm_ffma_narrow", dict(warps=1, warps_k=2), Problem(8, 4096, 4096, 1, 0),  # staging 1
     "warps_k == 1 or (few_rows == 1 and staged == 1)"),
    ("gemm_ffma_narrow", dict(staging=2, chunk=32, warps=1, warps_k=2), Problem(4096, 8, 4096, 1, 0),  # few columns
     "warps_k == 1 or (few_rows == 1 and staged == 1)"),
    ("gemm_ffma_narrow", dict(staging=2, chunk=32, step=8, warps=1, warps_k=8), Problem(8, 4096, 4096, 1, 0),
     "chunk % (warps_k * step) == 0 and width % warps_k == 0"),  # 4 k a group: not a step of 8
    ("gemm_ffma_narrow", dict(staging=2, chunk=64, warps=1, warps_k=8), Problem(12, 4096, 4096, 1, 0),
     "chunk % (warps_k * step) == 0 and width % warps_k == 0"),  # 12 rows among 8 groups
    ("gemm_ffma_narrow", dict(step=6), Problem(8, 4096, 4096, 1, 0),
     "step >= 4 and step % 4 == 0 and chunk % step == 0"),
    ("gemm_ffma_narrow", dict(step=8), Problem(32, 4096, 4096, 1, 0),  # 128 sums + 2 x 32 in flight
     "accumulators + in_flight <= 160"),
    ("gemm_ffma_narrow", dict(chunk=1024), Problem(32, 4096, 4096, 1, 0),
     "smem_bytes <= max_smem_per_block"),
    ("gemm_ffma_narrow", dict(min_slice_k=2), Problem(4096, 8, 4096, 1, 0),
     "blocks_per_sm >= 1 and min_slice_k >= step"),
    ("gemm_ffma_narrow", dict(staging=3), Problem(4096, 8, 4096, 1, 0), "staging == 1 or staging == 2"),
    ("gemm_ffma_narrow", dict(staging=2, chunk=128, warps=8), Problem(8, 4096, 4096, 1, 0),  # 2 x 128 x 1,024 floats of B
     "smem_bytes <= max_smem_per_block"),
]


@pytest.mark.parametrize("kernel,params,problem,rule", VIOLATIONS,
                         ids=[f"{v[0]}:{v[3]}" for v in VIOLATIONS])
def test_violation_names_its_rule(kernel, params, problem, rule):
    cfg = kernel_cfg(kernel, **params)
    size_rules = [c["rule"] for c in cfg.get("size_constraints", [])]
    expected = UnsupportedSize if any(r.startswith(rule) for r in size_rules) else InvalidParams
    with pytest.raises(expected) as info:
        build_spec(cfg, problem, H100)
    message = str(info.value)
    assert rule in message, message
    assert kernel in message
    # the message shows the values it saw, e.g. "bk=4"
    shown = dict(re.findall(r"(\w+)=([^,\s]+)", message.split("false with", 1)[1].split(" (")[0]))
    for key, value in params.items():
        if key in shown:
            assert shown[key] == str(value), message


def test_every_constraint_has_a_violation_case():
    covered = {(kernel, rule) for kernel, _, _, rule in VIOLATIONS}
    for path in sorted([*(CONF_DIR / "kernel").glob("[0-9][0-9]_*.yaml"),
                        *(CONF_DIR / "kernel").glob("gemm_*.yaml")]):
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        for item in cfg.get("constraints", []) + cfg.get("size_constraints", []):
            key = (cfg["name"], item["rule"])
            hit = key in UNREACHABLE or any(
                k == cfg["name"] and item["rule"].startswith(r) for k, r in covered)
            assert hit, f"no test breaks {key}"
            assert item.get("why"), f"{key} has no 'why'"


@pytest.mark.parametrize("name", sorted(p.stem for p in [*(CONF_DIR / "kernel").glob("[0-9][0-9]_*.yaml"),
                                                         *(CONF_DIR / "kernel").glob("gemm_*.yaml")]))
def test_defaults_are_valid_at_published_sizes(name):
    for shape in chapter_shapes(name):  # 24: the suite's skinny shapes instead of squares
        spec = build_spec(kernel_cfg(name), Problem(*shape, 1, 0), H100)
        assert spec.threads <= 1024
        # the grid covers C exactly once
        assert spec.entry and "{" not in spec.entry


def test_launch_geometry_follows_parameters_and_size():
    spec = build_spec(kernel_cfg("06_vectorize", bm=64, bn=128), Problem(512, 1024, 256, 1, 0), H100)
    assert spec.grid == (1024 // 128, 512 // 64)
    assert spec.block == (64 * 128 // 64,)
    assert spec.entry == "sgemm_vectorize<64, 128, 8, 8, 8>"
    assert spec.derived == {"threads": 128, "smem_bytes": 4 * (64 * 8 + 8 * 128)}
    naive = build_spec(kernel_cfg("01_naive"), Problem(100, 70, 5, 1, 0), H100)
    assert naive.grid == (ceil_div(100, 32), ceil_div(70, 32)) and naive.block == (32, 32)


@pytest.mark.parametrize("value", [0, -8, 2.5, "abc", True])
def test_tile_parameter_must_be_positive_integer(value):
    with pytest.raises(InvalidParams, match=r"kernel.params.bk > 0 and integer"):
        build_spec(kernel_cfg("05_blocktile_2d", bk=value), SQUARE, H100)


@pytest.mark.parametrize("shape,tiles,slices", [
    ((726, 5760, 8960), 135, 2),      # 2 waves; 2 slices: 3 half-waves (25% less), K 8960
    ((512, 10240, 8192), 160, 2),     # the same cut at 160 tiles
    ((2625, 5376, 24448), 462, 1),    # 8 half-waves -> 7 (12.5%): under the 15% cut
    ((3072, 3072, 3072), 288, 1),     # 6 -> 5 (17%), but K 3072 under two slices of 2048
    ((4096, 8192, 28672), 1024, 1),   # 16 -> 16: nothing to even out
    ((1024, 1024, 4096), 32, 4),      # few tiles: the slices that fill the SMs, as with 1
])
def test_gemm_tf32_min_slices_0_cuts_k_in_two_only_where_that_shortens_the_waves(shape, tiles, slices):
    """min_slices 0 (`zero_means` in the kernel config: a mode, not a count): 2 K slices where the
    tiles fill over half the SMs, 2 slices cut the waves, counted in half-waves, by 15% or more,
    and each keeps 2048 of K; else what min_slices 1 gives. Its launch is always that of 1 or of 2
    (the tuner's twin of one of them); 0 stays an error for any other parameter, and for a kernel
    whose config does not say what 0 means."""
    from src.tune.space import kernel_identity

    problem = Problem(*shape, 1.0, 0.0)
    base = dict(bm=256, bn=128, fit=1, stages=4, min_slice_k=512)
    spec = build_spec(kernel_cfg("gemm_tf32", min_slices=0, **base), problem, H100)
    assert spec.grid == (tiles * slices,)
    assert ("cluster" in spec.entry) == (slices > 1)
    twins = {n: kernel_identity(build_spec(kernel_cfg("gemm_tf32", min_slices=n, **base), problem, H100))
             for n in (1, 2)}
    assert kernel_identity(spec) == twins[2 if tiles * 2 > H100["sms"] and slices == 2 else 1]
    with pytest.raises(InvalidParams, match=r"kernel.params.bm > 0 and integer\)"):
        build_spec(kernel_cfg("gemm_tf32", bm=0), problem, H100)
    with pytest.raises(InvalidParams, match=r"min_slices > 0 and integer, or 0: 2 K slices only"):
        build_spec(kernel_cfg("gemm_tf32", min_slices=-1), problem, H100)
    with pytest.raises(InvalidParams, match=r"kernel.params.min_slices > 0 and integer\)"):
        build_spec(kernel_cfg("25_wgmma_tf32_any_shape", min_slices=0), problem, H100)


def test_malformed_config_is_a_config_error():
    cfg = kernel_cfg("05_blocktile_2d")
    cfg["constraints"].append({"rule": "bogus_name > 1", "why": "test"})
    with pytest.raises(ConfigError, match="bogus_name"):
        build_spec(cfg, SQUARE, H100)


@pytest.mark.parametrize("dims", [dict(m=0), dict(n=-1), dict(k=2.5), dict(m="abc"), dict(k=True)])
def test_problem_sizes_must_be_positive_integers(dims):
    values = dict(m=64, n=64, k=64, alpha=1.0, beta=0.0) | dims
    with pytest.raises(InvalidProblem, match=r"> 0 and integer"):
        Problem.from_cfg(values)


def test_a_shape_and_dimensions_that_disagree_are_refused():
    """shape=5x5x5 m=7 ran 7x5x5 without a word (m= replaced the shape's interpolation): refused,
    naming both; the same numbers twice, or a shape alone (m, n, k read from it), are one shape."""
    values = dict(m=7, n=5, k=5, alpha=1.0, beta=0.0)
    with pytest.raises(InvalidProblem, match=r"shape=5x5x5 says 5x5x5 but m=7, n=5, k=5 .*not both"):
        Problem.from_cfg(values | dict(shape="5x5x5"))
    assert Problem.from_cfg(values | dict(shape="7x5x5")).label == "7x5x5"
    assert Problem.from_cfg(values | dict(shape=None)).label == "7x5x5"


@pytest.mark.parametrize("shape", ["5x5", "axbxc", "5x5x5x5", "-5x5x5"])
def test_a_shape_that_is_not_mxnxk_is_refused_naming_the_shape(shape):
    """shape=5x5 reached the problem check as m='5x5' (its rule named m); the shape is named now,
    with its form, also where m=, n=, k= are set beside it (the shape would be dropped unread)."""
    from omegaconf import OmegaConf

    composed = OmegaConf.create({"size": 64, "shape": shape, "alpha": 1.0, "beta": 0.0,
                                 "m": "${shape_dim:${shape},0,${size}}",
                                 "n": "${shape_dim:${shape},1,${size}}",
                                 "k": "${shape_dim:${shape},2,${size}}"})
    for cfg in (composed, dict(m=5, n=5, k=5, alpha=1.0, beta=0.0, shape=shape)):
        with pytest.raises(InvalidProblem, match=rf"shape='{shape}' is not MxNxK \(rule: shape=MxNxK, three positive"):
            Problem.from_cfg(cfg)
    composed.shape = "0x5x5"  # the form is right: the zero is named as m, with m's rule
    with pytest.raises(InvalidProblem, match=r"m=0\. M, N and K must be positive"):
        Problem.from_cfg(composed)
    with pytest.raises(InvalidProblem, match=r"shape=0x5x5 says 0x5x5 but m=3, n=5, k=5"):
        Problem.from_cfg(dict(m=3, n=5, k=5, alpha=1.0, beta=0.0, shape="0x5x5"))  # not dropped unread


def test_problem_scalars_must_be_numbers():
    with pytest.raises(InvalidProblem, match="alpha"):
        Problem.from_cfg(dict(m=1, n=1, k=1, alpha="x", beta=0.0))
    p = Problem.from_cfg(dict(m=2, n=3, k=4, alpha=1, beta=0))
    assert p.flops == 2 * 2 * 3 * 4 and p.label == "2x3x4"


@pytest.mark.parametrize("kernel", ["20_wgmma_tf32", "22_ffma_warp_specialized", "23_wgmma_3xtf32",
                                    "25_wgmma_tf32_any_shape", "gemm_tf32", "gemm_3xtf32"])
def test_sm90a_chapter_needs_hopper(kernel):
    """20, 22, 23, 25 and the library's wgmma kernels are built for sm_90a, which runs on compute capability 9.0 only: an A100 is
    refused before anything is compiled, with the rule named."""
    with pytest.raises(InvalidParams, match=r"compute_capability == 90.*compute_capability=80"):
        build_spec(kernel_cfg(kernel), SQUARE, limits_from_spec("a100"))
    spec = build_spec(kernel_cfg(kernel), SQUARE, H100)
    assert spec.arch == "sm_90a"


@pytest.mark.parametrize("kernel", SM_80)
def test_cp_async_kernel_needs_sm_80(kernel):
    """A Turing GPU (compute capability 7.5) is refused before anything is compiled, the rule
    named; an A100 (8.0) is not."""
    turing = {**limits_from_spec("a100"), "compute_capability": 75}
    shape = Problem(8, 4096, 4096, 1, 0) if kernel == "gemm_ffma_narrow" else SQUARE
    with pytest.raises(InvalidParams, match=r"compute_capability >= 80.*compute_capability=75"):
        build_spec(kernel_cfg(kernel), shape, turing)
    assert build_spec(kernel_cfg(kernel), shape, limits_from_spec("a100")).arch is None


@pytest.mark.parametrize("shape", [(8, 644, 3176), (22, 3087, 9792), (16, 4096, 4096)])
def test_narrow_groups_along_k_cut_the_k_slices_not_the_warps(shape):
    """gemm_ffma_narrow, few rows, staged: warps_k groups of `warps` warps share each chunk's k rows
    in one block, so a block counts as warps_k blocks toward blocks_per_sm and the tile's K slices
    (grid.y, the parts the last block adds) drop about warps_k-fold while the warps along K stay."""
    m, n, k = shape
    base = dict(staging=2, chunk=64, step=4, warps=1, blocks_per_sm=8, min_slice_k=32)
    one = build_spec(kernel_cfg("gemm_ffma_narrow", **base, warps_k=1), Problem(m, n, k, 1, 0), H100)
    four = build_spec(kernel_cfg("gemm_ffma_narrow", **base, warps_k=4), Problem(m, n, k, 1, 0), H100)
    assert four.block == (4 * 32,) and one.block == (32,)
    assert four.grid[0] == one.grid[0] == ceil_div(n, 128)  # the same tiles
    assert 1 < four.grid[1] < one.grid[1]
    # exactly the slices of one-group blocks at a quarter of blocks_per_sm: 4 warps a block there
    quarter = build_spec(kernel_cfg("gemm_ffma_narrow", **{**base, "blocks_per_sm": 2}, warps_k=1),
                         Problem(m, n, k, 1, 0), H100)
    assert four.grid == quarter.grid
    assert four.entry.endswith(", 4>") and one.entry.endswith(", 1>")


def test_cluster_schedule_launches_its_cluster_entry():
    """22's schedule 3: a tile's K slices are one cluster of consecutive blocks, launched through
    the entry that carries __cluster_dims__, with an inbox for the others' pieces after the ring
    and no global workspace; the other schedules keep the plain entry."""
    params = dict(schedule=3, split_k=2, bm=128, bn=128, bk=16, wm=64, wn=32, tm=8, tn=8, stages=4)
    spec = build_spec(kernel_cfg("22_ffma_warp_specialized", **params), SQUARE, H100)
    assert spec.entry.startswith("sgemm_ffma_ws_cluster<128, 128, 16, 64, 32, 8, 8, 4, ")
    tiles = (SQUARE.m // 128) * (SQUARE.n // 128)
    assert spec.grid == (2 * tiles,)
    ring = 4 * 4 * (16 * (128 + 4) + 16 * 128)
    assert spec.dynamic_smem_bytes == ring + 4 * 128 * 128
    assert spec.workspace_bytes == 0
    plain = build_spec(kernel_cfg("22_ffma_warp_specialized", schedule=1, split_k=2), SQUARE, H100)
    assert plain.entry.startswith("sgemm_ffma_ws<") and plain.workspace_bytes > 0



@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (4095, 4097, 333), (17, 33, 5), (1, 1, 1)])
def test_3xtf32_prepass_and_workspace_follow_the_size(shape):
    """23 launches its split pre-pass first, over every 4-float chunk of A's padded rows (and of
    B's when N % 4 != 0), in at most 16 blocks per SM; its workspace holds A_big and A_small
    (and B's copy) with rows padded to 16 bytes; the promotion period reaches the entry."""
    m, n, k = shape
    spec = build_spec(kernel_cfg("23_wgmma_3xtf32"), Problem(m, n, k, 1.0, 0.0), H100)
    k_pad, n_pad = ceil_div(k, 4) * 4, ceil_div(n, 4) * 4
    copied = k * n_pad if n % 4 else 0
    assert spec.workspace_bytes == 4 * (2 * m * k_pad + copied)
    work = m * k_pad // 4 + copied // 4
    assert spec.prepass.entry == "split_tf32_operands" and spec.prepass.block == (256,)
    assert spec.prepass.grid == (min(ceil_div(work, 256), 16 * H100["sms"]),)
    assert spec.grid == (ceil_div(m, 128) * ceil_div(n, 128),) and spec.block == (384,)
    assert spec.entry == "sgemm_wgmma_3xtf32<128, 128, 4, 8, 1, 1, 2>"
    plain = build_spec(kernel_cfg("23_wgmma_3xtf32", accumulation=1), SQUARE, H100)
    assert plain.entry.endswith(", 1, 0>")  # PROMOTE 0: no FP32 total


@pytest.mark.parametrize("shape,slices,a_copied,b_copied", [
    ((4096, 4096, 4096), 1, 0, 0),     # 512 tiles fill the SMs, rows aligned: 20's launch
    ((4097, 4097, 4097), 1, 1, 1),     # both operands padded
    ((4095, 4097, 332), 1, 0, 1),      # only B (N % 4)
    ((1000, 1000, 999), 1, 1, 0),      # only A (K % 4)
    ((4096, 64, 4096), 8, 0, 0),       # 16 tiles: 8 slices of 512 fill 128 SMs
    ((511, 513, 8191), 8, 1, 1),       # 10 tiles: 8 slices (13 would fit, clusters are powers of two)
    ((256, 4096, 16384), 4, 0, 0),     # 32 tiles: 4 slices
    ((1024, 1024, 1024), 2, 0, 0),     # 32 tiles, K of 1024: 2 slices of 512
    ((1024, 1024, 256), 1, 0, 0),      # K below two slices of min_slice_k
])
def test_any_shape_tf32_pads_only_unaligned_rows_and_slices_few_tiles(shape, slices, a_copied,
                                                                       b_copied):
    """25 copies an operand into padded rows only when its rows are not 16-byte aligned, and
    launches no pre-pass when neither needs it; the tensor maps read the copies (or the operands
    themselves). With few tiles a tile's K range is split across a cluster of 2, 4 or 8 blocks
    (a power of two, within one wave of blocks, no slice under min_slice_k), through the entry
    that carries __cluster_dims__."""
    m, n, k = shape
    spec = build_spec(kernel_cfg("25_wgmma_tf32_any_shape"), Problem(m, n, k, 1.0, 0.0), H100)
    k_pad, n_pad = ceil_div(k, 4) * 4, ceil_div(n, 4) * 4
    tiles = ceil_div(m, 256) * ceil_div(n, 128)
    assert spec.grid == (tiles * slices,)
    assert slices == 1 or tiles * slices <= H100["sms"]
    assert spec.entry == (("sgemm_wgmma_tf32_any_shape_cluster" if slices > 1 else
                           "sgemm_wgmma_tf32_any_shape") + f"<256, 128, 4, 8, 2, {slices}>")
    assert spec.workspace_bytes == 4 * (a_copied * m * k_pad + b_copied * k * n_pad)
    if a_copied or b_copied:
        chunks = a_copied * m * k_pad // 4 + b_copied * k * n_pad // 4  # 4-float chunks written
        assert spec.prepass.entry == "pad_unaligned_rows"
        assert spec.prepass.grid == (min(ceil_div(chunks, 4 * 256), 16 * H100["sms"]),)
    else:
        assert spec.prepass is None  # a grid of 0 blocks: not launched
    a_map, b_map = spec.tensor_maps
    assert (a_map.matrix, a_map.element) == (("workspace" if a_copied else "a"), "tf32")
    assert a_map.region == ((0, m, k, k_pad) if a_copied else None)
    assert b_map.matrix == ("workspace" if b_copied else "b")
    assert b_map.region == ((4 * a_copied * m * k_pad, k, n, n_pad) if b_copied else None)


@pytest.mark.parametrize("shape,a_streamed,b_streamed", [
    ((4097, 4097, 4097), 1, 1),        # both rows unaligned
    ((4095, 4097, 332), 0, 1),         # only B (N % 4): A through the TMA
    ((1000, 1000, 999), 1, 0),         # only A (K % 4)
    ((4096, 4096, 4096), 0, 0),        # aligned: the same kernel and launch as unaligned_rows 1
])
def test_gemm_tf32_streams_unaligned_rows_without_a_prepass(shape, a_streamed, b_streamed):
    """unaligned_rows 2: the producer warpgroup copies the boxes of an operand whose rows are not
    16-byte aligned, so no pre-pass runs and no padded copy is allocated; that operand's tensor
    map is a stand-in over the workspace, never read; the other operand is read in place by the
    TMA. At an aligned shape it builds exactly what unaligned_rows 1 builds."""
    m, n, k = shape
    problem = Problem(m, n, k, 1.0, 0.0)
    spec = build_spec(kernel_cfg("gemm_tf32", unaligned_rows=2), problem, H100)
    padded = build_spec(kernel_cfg("gemm_tf32"), problem, H100)
    streams = a_streamed or b_streamed
    assert spec.entry == padded.entry[:-2] + f"{int(bool(streams))}>" and padded.entry.endswith(", 0>")
    assert spec.prepass is None and (padded.prepass is None) == (not streams)
    assert spec.workspace_bytes == (4 * 32 * 256 if streams else 0)
    a_map, b_map = spec.tensor_maps
    assert (a_map.matrix, a_map.region) == (("workspace", (0, 256, 32, 32)) if a_streamed else ("a", None))
    assert (b_map.matrix, b_map.region) == (("workspace", (0, 256, 32, 32)) if b_streamed else ("b", None))
    if not streams:
        assert (spec.entry, spec.grid, spec.tensor_maps) == (padded.entry, padded.grid, padded.tensor_maps)


@pytest.mark.parametrize("kernel,shape,register_operand,streamed", [
    ("gemm_3xtf32", (22, 3087, 9792), 1, True),    # few rows, B's rows odd: the pre-pass splits A alone
    ("gemm_3xtf32", (4095, 4097, 333), 1, True),
    ("gemm_3xtf32", (4096, 4096, 4096), 1, False),  # B aligned: the same kernel and pre-pass as unaligned_rows 1
    ("gemm_3xtf32", (1156, 65, 4351), 2, True),    # A in registers, K % 4: the pre-pass transposes B alone
    ("gemm_3xtf32", (7383, 20, 7088), 2, False),   # A aligned: the same kernel and pre-pass as unaligned_rows 1
    # gemm_tf32_swapped: role 1's block (A in registers) with one product, so A streams alike
    ("gemm_tf32_swapped", (1156, 65, 4351), 2, True),
    ("gemm_tf32_swapped", (4748, 23, 6078), 2, True),
    ("gemm_tf32_swapped", (7383, 20, 7088), 2, False),
])
def test_role_1_blocks_stream_the_unaligned_register_operand(kernel, shape, register_operand, streamed):
    """gemm_3xtf32 (and gemm_tf32_swapped, its A-in-registers block) with unaligned_rows 2: where
    the operand split in registers has rows that are not 16-byte aligned (B^T in registers: N % 4;
    A: K % 4), the producer copies its boxes, so the pre-pass leaves it alone
    (split_tf32_operands<0> splits A alone; split_tf32_b_transposed<0> transposes B without copying
    A) and the workspace ends in a 4 KiB stand-in that the operand's unread tensor map describes;
    the entry's last argument is STREAM. Elsewhere it builds exactly what unaligned_rows 1 builds."""
    m, n, k = shape
    problem = Problem(m, n, k, 1.0, 0.0)
    params = ({"register_operand": register_operand, "bm": 64 if register_operand == 1 else 128}
              if kernel == "gemm_3xtf32" else {})
    spec = build_spec(kernel_cfg(kernel, unaligned_rows=2, **params), problem, H100)
    padded = build_spec(kernel_cfg(kernel, **params), problem, H100)
    k_pad, n_pad = ceil_div(k, 4) * 4, ceil_div(n, 4) * 4
    assert padded.entry.endswith(", 0>") and spec.entry == padded.entry[:-2] + f"{int(streamed)}>"
    if not streamed:
        assert (spec.entry, spec.prepass, spec.workspace_bytes, spec.tensor_maps) == (
            padded.entry, padded.prepass, padded.workspace_bytes, padded.tensor_maps)
        return
    if register_operand == 1:
        assert padded.prepass.entry == "split_tf32_operands<1>" and spec.prepass.entry == "split_tf32_operands<0>"
        assert padded.workspace_bytes == 4 * (2 * m * k_pad + k * n_pad)
        assert spec.workspace_bytes == 4 * (2 * m * k_pad + 1024)
        assert spec.prepass.grid == (min(ceil_div(m * k_pad // 4, 256), 16 * H100["sms"]),)
        stand_in = spec.tensor_maps[2]
        assert (stand_in.matrix, stand_in.region) == ("workspace", (8 * m * k_pad, 32, 32, 32))
        return
    assert (padded.prepass.entry, spec.prepass.entry) == ("split_tf32_b_transposed<1>",
                                                          "split_tf32_b_transposed<0>")
    assert padded.workspace_bytes == 4 * (2 * n * k_pad + m * k_pad)
    assert spec.workspace_bytes == 4 * (2 * n * k_pad + 1024)
    b_tiles = ceil_div(k_pad, 32) * ceil_div(n, 32)
    assert spec.prepass.grid == (min(b_tiles, 16 * H100["sms"]),)  # B's transpose tiles alone
    stand_in = spec.tensor_maps[0]
    assert (stand_in.matrix, stand_in.region, stand_in.box) == (
        "workspace", (8 * n * k_pad, 32, 32, 32), (32, 32))
    assert spec.tensor_maps[1:] == padded.tensor_maps[1:]  # B_big^T (and B_small^T) as before


@pytest.mark.parametrize("shape,unaligned_rows,stream", [
    ((22, 739, 326), 2, 3),       # K % 4: A copied by cp.async and split; B's rows (N % 4) copied too
    ((297, 44, 673), 1, 2),       # K % 4, B aligned: A copied by cp.async and split, B by the TMA
    ((8, 644, 3176), 1, 6),       # K % 4 == 0: A brought by the TMA, split by the producers
    ((4307, 583, 136), 2, 7),     # the TMA's A, B's rows copied
])
def test_3xtf32_split_by_the_producer_runs_no_pre_pass(shape, unaligned_rows, stream):
    """split_by 2 with B^T in registers: the producer warpgroup splits A in each stage, so no
    pre-pass runs and the workspace holds only stand-ins (4 KiB for A_big's and A_small's unread
    maps, 4 KiB more for B's when its rows are copied); the entry's STREAM says what the producer
    copies (bit 2: A's rows split in the stage; 4: brought by the TMA over A itself, K % 4 == 0);
    a third barrier a stage (`loaded`) is in the shared memory only with the TMA's A."""
    m, n, k = shape
    problem = Problem(m, n, k, 1.0, 0.0)
    params = {"register_operand": 1, "bm": 64, "bn": 64, "fit": 2, "unaligned_rows": unaligned_rows}
    spec = build_spec(kernel_cfg("gemm_3xtf32", split_by=2, **params), problem, H100)
    prepassed = build_spec(kernel_cfg("gemm_3xtf32", **params), problem, H100)
    assert prepassed.prepass.entry.startswith("split_tf32_operands") and spec.prepass is None
    assert spec.entry == prepassed.entry[:-2] + f"{stream}>" and spec.grid == prepassed.grid
    b_streamed = stream & 1
    assert spec.workspace_bytes == 4096 * (1 + b_streamed)
    a_big, a_small, b = spec.tensor_maps
    if stream & 4:
        assert (a_big.matrix, a_big.region, a_big.box) == ("a", None, prepassed.tensor_maps[0].box)
    else:
        assert (a_big.matrix, a_big.region, a_big.box) == ("workspace", (0, 32, 32, 32), (32, 32))
    assert (a_small.matrix, a_small.region, a_small.box) == ("workspace", (0, 32, 32, 32), (32, 32))
    assert (b.matrix, b.region) == (("workspace", (4096, 32, 32, 32)) if b_streamed else ("b", None))
    assert spec.dynamic_smem_bytes - prepassed.dynamic_smem_bytes == (
        8 * 4 if stream & 4 else 0)  # 4 stages: one more barrier each with the TMA's A


@pytest.mark.parametrize("shape,params", [
    ((1156, 65, 4351), {"register_operand": 2}),                  # A in registers: B^T still by the pre-pass
    ((4095, 4097, 333), {"register_operand": 1, "unaligned_rows": 1}),  # B padded by the pre-pass anyway
])
def test_3xtf32_split_by_2_builds_what_1_builds_where_it_cannot_drop_the_pre_pass(shape, params):
    """split_by 2 needs B^T in registers and B read without a padded copy; elsewhere it builds
    exactly what split_by 1 builds (so the tuning space crosses it freely, measured once)."""
    problem = Problem(*shape, 1.0, 0.0)
    spec = build_spec(kernel_cfg("gemm_3xtf32", split_by=2, **params), problem, H100)
    same = build_spec(kernel_cfg("gemm_3xtf32", **params), problem, H100)
    assert (spec.entry, spec.grid, spec.prepass, spec.workspace_bytes, spec.tensor_maps,
            spec.dynamic_smem_bytes) == (same.entry, same.grid, same.prepass, same.workspace_bytes,
                                         same.tensor_maps, same.dynamic_smem_bytes)


def test_a_prepass_needs_a_workspace_entry_and_geometry():
    cfg = kernel_cfg("23_wgmma_3xtf32")
    del cfg["launch"]["prepass"]["grid"]
    with pytest.raises(ConfigError, match="launch.prepass needs an entry, a grid and a block"):
        build_spec(cfg, SQUARE, H100)
    cfg = kernel_cfg("23_wgmma_3xtf32")
    del cfg["launch"]["workspace_bytes"]
    with pytest.raises(ConfigError, match="need launch.workspace_bytes"):
        build_spec(cfg, SQUARE, H100)


@pytest.mark.parametrize("gpu", ["a100", "a6000", "rtx4090"])
def test_every_portable_chapter_has_valid_defaults_on_other_gpus(gpu):
    """A user on an A100, A6000 or RTX 4090 gets valid defaults: every chapter not built for
    sm_90a passes its constraints against that GPU's limits (threads, shared memory, compute
    capability) with its configured parameters at the published sizes."""
    limits = limits_from_spec(gpu)
    checked = 0
    for path in sorted((CONF_DIR / "kernel").glob("*.yaml")):
        cfg = kernel_cfg(path.stem)
        if cfg.get("backend") != "nvrtc" or cfg.get("arch") == "sm_90a" or cfg.get("dispatch"):
            continue  # best_*: the chapter it dispatches to is checked (test_suite.py)
        for shape in chapter_shapes(path.stem):
            spec = build_spec(cfg, Problem(*shape, 1.0, 0.0), limits)
            assert spec.threads <= limits["max_threads_per_block"]
            assert spec.dynamic_smem_bytes <= limits["max_smem_per_block"]
        checked += 1
    assert checked == 26  # chapters 01-19, 21, 24, gemm_ffma, gemm_ffma_narrow, gemm_ffma_skinny, gemm_mma_tf32 and gemm_mma_3xtf32 (the others are built for sm_90a: Hopper only)


@pytest.mark.parametrize("kernel,params,shape,fitted", [
    # gemm_tf32: the rows, shared evenly among as many tiles as bm needs, rounded up to 8
    ("gemm_tf32", dict(bm=64), (19, 1287, 2026), ("m", 24)),
    ("gemm_tf32", dict(bm=128), (67, 3579, 2991), ("m", 72)),
    ("gemm_tf32", dict(bm=128, bn=64), (1156, 65, 4351), ("m", 120)),   # ten tiles of 120, not of 128
    ("gemm_tf32", dict(bm=64), (2, 338, 1906), ("m", 8)),
    ("gemm_tf32", dict(bm=128), (4096, 4096, 4096), ("m", 128)),      # already a whole number of tiles
    # gemm_3xtf32: wgmma's N side, the rows in role 0 and the columns in role 1
    ("gemm_3xtf32", dict(bm=64, bn=64), (19, 1287, 2026), ("m", 24)),
    ("gemm_3xtf32", dict(bm=128, bn=128, register_operand=2), (1156, 65, 4351), ("n", 72)),
    ("gemm_3xtf32", dict(bm=64, bn=64, register_operand=2), (14792, 10, 3067), ("n", 16)),
])
def test_fit_2_fits_wgmmas_n_side_to_the_shape(kernel, params, shape, fitted):
    """`fit` 2 sizes wgmma's N side of the block tile to the shape (any multiple of 8 up to bm, or
    bn in gemm_3xtf32's role 1): the instantiation, the grid's tile count and the TMA box follow
    it; the other side and `fit` 1 keep bm and bn as set."""
    m, n, k = shape
    side, size = fitted
    problem = Problem(m, n, k, 0.5, 3.0)
    spec = build_spec(kernel_cfg(kernel, **params, fit=2), problem, H100)
    plain = build_spec(kernel_cfg(kernel, **params, fit=1), problem, H100)
    cfg_bm, cfg_bn = (spec.params["bm"], spec.params["bn"])
    block_m, block_n = (size, cfg_bn) if side == "m" else (cfg_bm, size)
    assert (spec.derived["block_m"], spec.derived.get("block_n", cfg_bn)) == (block_m, block_n)
    assert (plain.derived["block_m"], plain.derived.get("block_n", cfg_bn)) == (cfg_bm, cfg_bn)
    tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
    assert spec.derived["tiles"] == tiles and spec.grid == (tiles * spec.derived["slices"],)
    args = [int(a) for a in spec.entry.split("<")[1].rstrip(">").split(",")]
    assert args[:1] == [block_m] if kernel == "gemm_tf32" else args[1:3] == [block_m, block_n]
    boxes = [tm.box for tm in spec.tensor_maps]
    if kernel == "gemm_tf32":
        assert boxes[0] == (32, block_m)                     # A's rows per stage
    elif side == "m":
        assert boxes[0] == boxes[1] == (32, block_m)         # A_big and A_small
    else:
        assert boxes[1] == boxes[2] == (32, block_n)         # B_big^T and B_small^T


@pytest.mark.parametrize("shape,block_n,slices", [
    ((1156, 65, 4351), 72, 8),     # 65 columns in one tile of 72 (bn 128); 10 tiles: 8 slices of 544 k
    ((14792, 10, 3067), 16, 1),    # 116 row tiles, most of a wave: unsliced
    ((4096, 64, 4096), 64, 4),     # a whole tile: block_n is bn; 32 tiles, 4 slices
])
def test_swapped_tf32_puts_the_fitted_columns_on_wgmmas_n_side(shape, block_n, slices):
    """gemm_tf32_swapped: role 1's block with one product. The columns, fitted with `fit` 2, are
    wgmma's N side (the second template argument and B_big^T's TMA box); A is read as it is
    (FP32, rounded in registers) unless K % 4; the pre-pass is role 1's transposing split; K slices
    as in gemm_tf32."""
    m, n, k = shape
    spec = build_spec(kernel_cfg("gemm_tf32_swapped", bn=128 if n > 64 else 64),
                      Problem(m, n, k, 0.5, 3.0), H100)
    args = [int(a) for a in spec.entry.split("<")[1].rstrip(">").split(",")]
    assert args[1] == block_n == spec.derived["block_n"]
    tiles = ceil_div(m, 128) * ceil_div(n, block_n)
    assert spec.derived["slices"] == slices and spec.grid == (tiles * slices,)
    assert spec.entry.startswith("gemm_tf32_swapped_cluster<" if spec.derived["slices"] > 1
                                 else "gemm_tf32_swapped<")
    a_map, b_map = spec.tensor_maps
    assert a_map.matrix == ("workspace" if k % 4 else "a") and a_map.box == (32, 128)
    assert b_map.matrix == "workspace" and b_map.box == (32, block_n)
    assert spec.prepass.entry == "split_tf32_b_transposed<1>"  # with A copied where K % 4
    assert spec.precision == "tf32"
