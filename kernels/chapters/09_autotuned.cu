// 09 autotuned: chapter 08's kernel with tile parameters found on the GPU itself.
//
// What changed from 08: no code. 08's loads already walk the tiles in strides of THREADS, so any
// block tile, K step and thread tile that passes conf/kernel/09_autotuned.yaml's constraints is a
// valid kernel. The parameters come from a tile-parameter sweep on each GPU (a Hydra multirun over
// kernel.params.*; invalid combinations are rejected by the constraints before compiling) and are
// stored per GPU in conf/tuned/<gpu>.yaml, which the runner reads when it detects that GPU.
// Predicted effect: the worklog's autotuning gained ~5% on an A6000; on the H100 the 06 defaults
// (128 x 128 x 8, one 256-thread block per 8 KiB) are far from the best tile shape, so more.
//
// Tile hierarchy: block tile = BM x BN of C, K walked in steps of BK;
//                 thread tile = TM x TN (THREADS = BM * BN / (TM * TN)).
#include "08_bank_padding.cu"
