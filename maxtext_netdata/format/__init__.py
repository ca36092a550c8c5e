"""The netdata-v1 token format: the 268-token vocabulary, vectorized encode and decode, and
the `hashed` field order.

Imports nothing of this package but `errors`: every other room builds on it.
"""
