"""novaforge's benchmark suite: workloads, runners (novaforge and its peers), the harness that
runs each in fresh interleaved processes, and the results files and tables (`novaforge bench`).

Invariant: importing this package loads no runner and no peer package; runners load inside
the worker processes that measure them.
"""
