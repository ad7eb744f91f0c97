"""flowc benchmark suites and the `make bench` driver; see benchmarks/README.md."""
