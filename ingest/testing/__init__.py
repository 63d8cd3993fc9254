"""Throw-away infrastructure for tests, benchmarks and local trials: a private PostgreSQL, a Spark cluster.

Everything here listens on 127.0.0.1 only, lives in a temporary directory and is stopped on exit.
"""
