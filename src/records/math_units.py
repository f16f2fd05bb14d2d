"""Which arithmetic a kernel's products run on: the `math` of a config and of a record.

- ffma: FP32 fused multiply-adds on the SIMT cores (FP32 accuracy);
- 3xtf32: three TF32 products per step on the tensor cores, FP32-accurate (verified at the FP32
  tolerance, paired with cuBLAS FP32), but not FFMA: its ceiling is the tensor cores' third;
- tf32: TF32 products on the tensor cores (TF32 accuracy, paired with cuBLAS TF32).

Every chapter's config names its math (conf/kernel/*.yaml `math:`); a dispatching kernel
(best_*) runs the math of the chapter it chose for the shape. Records written before records
carried `math` get it from that chapter's config (`of_chapter`).
"""

from __future__ import annotations

from functools import lru_cache

from src.paths import CONF_DIR

ORDER = ("ffma", "3xtf32", "tf32")  # tables and figures list them in this order
LABEL = {"ffma": "FFMA", "3xtf32": "3xTF32", "tf32": "TF32"}
MEANING = {"ffma": "FP32 FFMA on the SIMT cores",
           "3xtf32": "FP32-accurate, three TF32 products on the tensor cores",
           "tf32": "TF32 on the tensor cores"}


def label(math: str | None) -> str:
    """FFMA, 3xTF32 or TF32 ('?' when unknown)."""
    return LABEL.get(math or "", math or "?")


@lru_cache(maxsize=None)
def of_chapter(kernel: str | None) -> str | None:
    """The `math:` of conf/kernel/<kernel>.yaml (None for a dispatcher or an unknown name)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "kernel" / f"{kernel}.yaml"
    if not kernel or not path.is_file():
        return None
    value = OmegaConf.load(path).get("math")
    return None if value is None else str(value)


def of_record(record) -> str | None:
    """The math a record ran: its own field, else its chapter's (the chosen one for best_*)."""
    return getattr(record, "math", None) or of_chapter(record.dispatched_to or record.kernel)
