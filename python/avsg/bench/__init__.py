"""``avsg bench ...``: the benchmarks (see docs/benchmarks.md)."""

# subcommand -> (module, one-line help)
COMMANDS = {
    "plan": ("plan", "hash plan vs dual-pointer on the paper's three grids (modelled time)"),
    "gather": ("gather", "gather partitions S1 / S2 / S3 on the paper's grid, link-aware (modelled)"),
    "hash-buckets": ("hash_buckets", "index overflow (stash) against hash table size, on a trace"),
    "emulation": ("emulation", "CPU time per call of plan and gather, strict vs fast emulation"),
    "decode": ("decode", "modelled DeepSeek-V3.2 decode step on a 910B per mode (an estimate)"),
    "calibrate": ("calibrate", "NPU microbenchmarks that write a hardware profile (NPU only)"),
    "all": ("run_all", "every benchmark in turn (--quick: reduced grids); headline ratios last"),
}
