"""Numba plumbing shared by every room with compiled kernels: the compile cache keyed on the
project files a kernel imports (`kernel_cache`), named byte constants for kernels that read
text, and `hash_table`, a compiled table of fixed-width keys kept across calls.

Imports nothing of this package: `data` and `input_pipeline` build on it.
"""
