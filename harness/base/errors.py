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
