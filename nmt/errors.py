"""The one exception type that reaches the user as a one-line message.

Raise `NmtError` for anything the user can fix (a missing file, a bad option, a
corrupted checkpoint). The CLI prints `nmt-<command>: error: <message>` and exits
non-zero, without a traceback unless `debug=true`.
"""


class NmtError(Exception):
    """A user-facing error: its message is printed as one line, without a traceback."""
