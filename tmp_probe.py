import sys, subprocess, tempfile, re, glob, os, shutil
sys.path.insert(0, '.')
from omegaconf import OmegaConf
from src.compile import build_cubin, expand_source
from src.gpu import limits_from_spec
from src.problem import Problem
from src.spec import build_spec
print([p for p in glob.glob('/usr/local/cuda*/lib64/libnvrtc.so*')] + glob.glob('/usr/lib/x86_64-linux-gnu/libnvrtc*'))
def regs(name):
    cfg = OmegaConf.load(f'conf/kernel/{name}.yaml')
    spec = build_spec(cfg, Problem(2048, 2048, 2048, 1.0, 0.0), limits_from_spec('h100_sxm'))
    with tempfile.TemporaryDirectory() as tmp:
        cb = build_cubin(expand_source(spec.source), spec.entry, spec.arch or 'sm_90', tmp)
        out = subprocess.run(['cuobjdump', '--dump-resource-usage', cb.path], capture_output=True, text=True).stdout
        return re.search(r'REG:(\d+)', out).group(1)
for variant in ('new', 'old'):
    if variant == 'old':
        shutil.copy('kernels/common.cuh', '/tmp/common_new.cuh'); shutil.copy('tmp_common_old.cuh', 'kernels/common.cuh')
    print(variant, {k: regs(k) for k in ['06_vectorize', '07_bank_linearize', '08_bank_padding', '17_flagship', '21_ffma_hopper']})
shutil.copy('/tmp/common_new.cuh', 'kernels/common.cuh')
