"""One error tree for netbench.

Library code raises these; only the CLI turns them into messages and exit codes.
Every error carries a one-line message and, where we know one, a hint saying how to fix it.
"""

from __future__ import annotations


class NetbenchError(Exception):
    """Base of every error netbench reports to a user."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(NetbenchError):
    """Bad input: a profile file, a flag, a value with an unknown unit."""

    exit_code = 2


class ProfileError(UsageError):
    """A profile that cannot be loaded or fails validation."""


class PrivilegeError(NetbenchError):
    """The operation needs root (CAP_NET_ADMIN)."""

    exit_code = 3


class TestbedError(NetbenchError):
    """Creating, finding or removing testbed nodes failed."""

    __test__ = False  # not a pytest test class


class EmulationError(NetbenchError):
    """Applying, reading or removing an emulation failed."""


class BackendUnavailable(EmulationError):
    """The requested emulation backend cannot run on this host."""


class JobError(NetbenchError):
    """A training job could not be started or failed."""


class StateError(NetbenchError):
    """The on-disk journal or lock is unusable, or another run holds the lock."""


class ResetIncomplete(StateError):
    """A reset went through everything but could not undo some of it: `removed` holds what
    it did remove (as its caller returns it), `failures` one line per thing left in place."""

    def __init__(self, removed, failures: list[str]) -> None:
        shown_ = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
        super().__init__(f"reset left {len(failures)} thing(s) in place: {shown_}",
                         hint="everything else was removed; what failed stays journaled: fix the cause "
                              "and run the reset again")
        self.removed = removed
        self.failures = list(failures)


class VerifyFailed(NetbenchError):
    """A measured link is outside the tolerance of its configured profile."""


def shown(value: object, limit: int = 80) -> str:
    """`value` as repr() writes it, cut to at most about `limit` characters, for messages
    that quote what a user wrote (a YAML value may be a megabyte long or deeply nested)."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = short.maxlong = limit
    short.maxlevel, short.maxlist, short.maxtuple, short.maxdict, short.maxset = 3, 8, 8, 6, 8
    try:
        text = short.repr(value)
    except ValueError:  # an int of over 4300 digits has no repr
        text = f"<a number of about {int(value.bit_length() * 0.30103)} digits>" if isinstance(value, int) else "<?>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown_key(key: object, limit: int = 80) -> str:
    """A mapping key as the user wrote it (printable strings unquoted), cut to about `limit` characters."""
    text = key if isinstance(key, str) and key.isprintable() else shown(key, limit)
    return text if len(text) <= limit else text[:limit - 3] + "..."
