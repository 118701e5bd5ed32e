"""Benchmarks, run from a checkout (`python -m benchmarks.NAME`); not installed on devices or gateways.

Each module's docstring says what it measures and how; docs/benchmarks.md keeps the figures.
"""
