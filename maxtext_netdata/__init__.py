"""maxtext_netdata: a MaxText-style input pipeline and trainer for network measurements."""

__version__ = "0.1.0"
