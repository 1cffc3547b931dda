"""User-facing errors: what was wrong and what to do, shown without a traceback by the CLI."""


class HarnessError(Exception):
    """Bad input or a missing prerequisite. The message must say what to do about it."""


class UnknownModelError(HarnessError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class WeightsNotFoundError(HarnessError):
    pass


class ChecksumError(HarnessError):
    pass


class VocabMismatchError(HarnessError):
    pass


class UnsupportedError(HarnessError):
    """A precision, device or backend that this machine or build cannot provide."""


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised while handling, a KeyboardInterrupt: Ctrl-C while a library
    imports or loads can surface as that library's own error (transformers' lazy import turns it
    into ModuleNotFoundError), which is an interrupt all the same, not a crash."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
