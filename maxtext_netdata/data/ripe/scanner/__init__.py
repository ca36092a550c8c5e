"""The compiled JSON scanner of `ingest`: byte-level JSON reading (`json_scan`) and the pass
that maps RIPE ping results to columns (`kernel`), both numba-compiled.

May import `kernels` only: the scanner knows bytes, not files, rows or errors.
"""
