"""sgemm-lab: compile, verify and time hand-written CUDA SGEMM kernels against cuBLAS.

Data flows one way, one module per step:
config -> spec (params checked) -> compile (module) -> verify -> timing -> record -> report.
`job` strings the steps together for one Hydra job; `run` is the Hydra entry point.
"""
