"""Running one job: config -> prepare (problem, target, tuned parameters, spec, source) -> measure
(compile, verify, time, compare with the baselines) -> record. The public API of this room:

    prepare(cfg) / prepare_kernel(kernel_cfg, problem, target(...))  -> PreparedJob
    measure(prepared, baselines, record)                             -> the record, filled
    run_job(cfg, ...)                                                -> Record (never raises
                                                                        for an expected failure)
"""
