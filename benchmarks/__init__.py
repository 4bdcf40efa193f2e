"""The benchmark suite (`make bench`). Not part of the tests; see docs/performance.md."""
