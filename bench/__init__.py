"""npmdb benchmarks: quality (EM), latency, ingest. Run as ``python -m bench.NAME``."""
