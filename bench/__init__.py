"""delayapp benchmarks: ``python -m bench`` prints a table and writes a JSON result file."""
