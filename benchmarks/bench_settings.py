"""The product's settings plus the benchmark's own URL conf (the trivial endpoint)."""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "benchmarks.bench_urls"
DEBUG = False
