"""cellar.bench: `make bench` / `cellar bench`.

Starts its own cluster (a master and one node as child processes), drives it from a client in a
third process, measures this machine's own ceilings (loopback TCP, page-aligned memcpy) in the
same run, and reports every figure as a ratio to its ceiling, since these machines are noisy;
it names the one machine setting that moves small-operation figures 2-3x (halt_poll.py).
Results go to bench/results/<date>-<host>.json and a Markdown table on stdout. It asserts
nothing: figures live here, never as timed assertions in tests.
Import rule: any (benchmarks drive every part)
"""

from cellar.bench.run import main

__all__ = ["main"]
