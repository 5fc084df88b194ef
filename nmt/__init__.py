"""nmt: a command-line neural machine translation toolkit."""

__version__ = "0.1.0"
