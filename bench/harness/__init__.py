"""The benchmark harness behind bench/run.

util         commands, sizes, progress lines, teardown on exit and signals
deps         Debian and Python packages, the release binaries
fs           loop-device file systems (direct I/O), cache dropping, leftovers
layouts      the test files: sparse layouts and fully written files
servers      sluice and nfs-ganesha on 127.0.0.1 or behind the wire, readiness, stopping
clients      sluice-load, nfs-rs (nfsrs_read.py) and dd iflag=direct
wire         --wire: the servers in a network namespace behind a rate-limited veth pair
linkprobe    the link's measured rate each way and round trip
probes       one-off protocol checks reported in the notes
experiments  sparse, stream and mix, planned as rounds of variants
report       summaries, ratios, results.json/.md, plots, docs/benchmarks.md
"""
