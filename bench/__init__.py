"""Benchmarks of hostring: they print figures with the workload and the machine stated, never pass/fail.

`python -m bench.node [--json] [--quick]` measures one frontier node (through gRPC and in process) and its RAM.
"""
