"""The `hostring` command: CLI, cluster commands, the all-in-one `crawl` and `demo`.

The top floor: the only package that may import several services (frontier_node, fetch_worker, coordinator);
`demo` also uses the test web from hostring_testing. `python -m hostring_cli ...` is the same as `hostring ...`.
"""
