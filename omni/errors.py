"""Typed errors a request can end with. The API layer maps each to its wire format."""

from __future__ import annotations


class OmniError(Exception):
    """Base of every error a client of AsyncOmni may see."""


class AdmissionError(OmniError):
    """The pipeline already has its maximum number of requests in flight."""


class InvalidInputError(OmniError):
    """The request's inputs cannot be carried to the engines (e.g. not encodable)."""


class DuplicateRequestIdError(OmniError):
    """A request with this id is already in flight."""


class ShuttingDownError(OmniError):
    """The server is draining and admits no new requests."""


class StageUnavailableError(OmniError):
    """A stage the request needs has no live replica."""


class RequestFailedError(OmniError):
    """A stage failed this request (bad input for the model, or an engine error)."""

    def __init__(self, message: str, stage: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage


class RejectedInputError(RequestFailedError):
    """A stage found the request's input unusable (e.g. a video it cannot read): the
    client's to fix, so a 400, unlike other stage failures. ``field``: the input field at
    fault when the stage named one (``messages[0].content[1]``), the 400's ``param``."""

    def __init__(self, message: str, stage: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, stage)
        self.field = field


class ReplicaDeadError(RequestFailedError):
    """The replica serving this request died."""


class DeadlineExceededError(OmniError):
    """The request ran past its deadline and was aborted everywhere."""


class RequestAbortedError(OmniError):
    """The request was aborted (by the caller, or because the server stopped)."""


class ServerStoppedError(RequestAbortedError):
    """The server stopped: the request was still running when its drain deadline passed."""
