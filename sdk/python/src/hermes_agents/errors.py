"""Hermes error codes as typed exceptions. Every error the API returns carries one of Hermes's
stable codes (docs/protocol.md); each code has its own exception class, all under `HermesError`."""

from __future__ import annotations


class HermesError(Exception):
    """An error with a Hermes code (`NOT_FOUND`, `INVALID_ARGUMENT`, ...)."""

    code = "INTERNAL"
    retryable = False

    def __init__(self, message: str, code: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def _code(name: str, code: str, retryable: bool = False, doc: str = "") -> type[HermesError]:
    return type(name, (HermesError,), {"code": code, "retryable": retryable, "__doc__": doc or code})


InvalidArgument = _code("InvalidArgument", "INVALID_ARGUMENT", doc="The request or its inputs are invalid.")
PlanInvalid = _code("PlanInvalid", "PLAN_INVALID", doc="The plan is not a valid DAG of known task types.")
NotFound = _code("NotFound", "NOT_FOUND")
FailedPrecondition = _code("FailedPrecondition", "FAILED_PRECONDITION")
Unavailable = _code("Unavailable", "UNAVAILABLE", retryable=True)
Timeout = _code("Timeout", "TIMEOUT", retryable=True)
ToolError = _code("ToolError", "TOOL_ERROR", doc="A tool failed; raised from a worker task, it fails the task.")
LlmParseError = _code("LlmParseError", "LLM_PARSE_ERROR")
BudgetExceeded = _code("BudgetExceeded", "BUDGET_EXCEEDED")
Denied = _code("Denied", "DENIED")
NoProgress = _code("NoProgress", "NO_PROGRESS")
NoCapableAgent = _code("NoCapableAgent", "NO_CAPABLE_AGENT")
PoisonMessage = _code("PoisonMessage", "POISON_MESSAGE")
Cancelled = _code("Cancelled", "CANCELLED")
LimitExceeded = _code("LimitExceeded", "LIMIT_EXCEEDED", retryable=True)
Unauthenticated = _code("Unauthenticated", "UNAUTHENTICATED")
Internal = _code("Internal", "INTERNAL")

BY_CODE: dict[str, type[HermesError]] = {
    cls.code: cls
    for cls in (InvalidArgument, PlanInvalid, NotFound, FailedPrecondition, Unavailable, Timeout, ToolError,
                LlmParseError, BudgetExceeded, Denied, NoProgress, NoCapableAgent, PoisonMessage, Cancelled,
                LimitExceeded, Unauthenticated, Internal)
}


class RetryableToolError(HermesError):
    """Raise from a worker task for a transient failure: the result is marked retryable, so the
    dispatcher tries the node again under its retry policy."""

    code = "UNAVAILABLE"
    retryable = True


def from_code(code: str, message: str, retry_after_s: float | None = None) -> HermesError:
    """The exception for a Hermes code; an unknown code is an `Internal` that keeps it."""
    cls = BY_CODE.get(code)
    if cls is None:
        return Internal(message, code=code, retry_after_s=retry_after_s)
    return cls(message, retry_after_s=retry_after_s)


def from_grpc(error) -> HermesError:
    """The exception for a gRPC error from a Hermes server, whose message reads `CODE: message`."""
    details = error.details() or ""
    code, sep, message = details.partition(": ")
    retry_after = None
    for key, value in error.trailing_metadata() or ():
        if key == "retry-after":
            try:
                retry_after = float(value)
            except ValueError:
                pass
    if sep and code in BY_CODE:
        return from_code(code, message, retry_after)
    import grpc

    fallback = {
        grpc.StatusCode.UNAVAILABLE: "UNAVAILABLE",
        grpc.StatusCode.DEADLINE_EXCEEDED: "TIMEOUT",
        grpc.StatusCode.UNAUTHENTICATED: "UNAUTHENTICATED",
        grpc.StatusCode.PERMISSION_DENIED: "DENIED",
        grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
        grpc.StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
    }.get(error.code(), "INTERNAL")
    return from_code(fallback, details or str(error.code()), retry_after)
