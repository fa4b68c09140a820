"""The domain errors of the service, mapped to gRPC status codes once, at the edge.

Each carries a `reason` from the documented list (`ErrorInfo.reason`, see
`proto/README.md`), and `metadata` naming what it is about.

AgentLoopError            any error a caller can be told about
├── InvalidArgument       bad input; names the field        -> INVALID_ARGUMENT
├── NotFound              unknown agent or session          -> NOT_FOUND
├── AlreadyExists         duplicate agent or session id     -> ALREADY_EXISTS
├── FailedPrecondition    e.g. the agent is disposed        -> FAILED_PRECONDITION
├── ResourceExhausted     a limit was reached               -> RESOURCE_EXHAUSTED
├── OutOfRange            past the end of a log             -> OUT_OF_RANGE
├── SessionDamaged        a stored session cannot be read   -> DATA_LOSS
├── Unavailable           try again after `retry_seconds`   -> UNAVAILABLE (+ RetryInfo)
└── StoreConflict         another writer owns the session   -> ABORTED (server.stores)
CodedError                a failure inside a turn with a machine-readable code
└── TurnFatal             one that ends the turn even inside a tool call
Aborted                   the step's abort signal fired; carries the reason
"""

from __future__ import annotations


class AgentLoopError(Exception):
    """Base of the errors reported to callers."""

    reason = "INTERNAL"
    """The `ErrorInfo.reason`: a stable, documented UPPER_SNAKE word."""

    def __init__(self, message: str, reason: str = "", **metadata: str) -> None:
        super().__init__(message)
        if reason:
            self.reason = reason
        self.metadata = {key: value for key, value in metadata.items() if value}
        """`ErrorInfo.metadata`: the ids the error is about."""


class InvalidArgument(AgentLoopError):
    """A request field is missing or malformed."""

    reason = "INVALID_FIELD"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}", field=field)
        self.field = field
        self.problem = problem


class NotFound(AgentLoopError):
    """The named agent or session does not exist."""

    reason = "NOT_FOUND"


class AgentNotFound(NotFound):
    """No agent has this id (and none was disposed with it lately)."""

    reason = "AGENT_NOT_FOUND"

    def __init__(self, agent_id: str) -> None:
        super().__init__(f'agent "{agent_id}" not found', agent_id=agent_id)


class SessionNotFound(NotFound):
    """No session has this id, stored or live."""

    reason = "SESSION_NOT_FOUND"

    def __init__(self, session_id: str) -> None:
        super().__init__(f'session "{session_id}" not found', session_id=session_id)


class AlreadyExists(AgentLoopError):
    """The id is already taken."""

    reason = "ALREADY_EXISTS"


class FailedPrecondition(AgentLoopError):
    """The target is in a state that forbids the call."""

    reason = "FAILED_PRECONDITION"


class AgentDisposed(FailedPrecondition):
    """The agent was disposed; send, steer and inject are refused."""

    reason = "AGENT_DISPOSED"

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f'agent "{agent_id}" is disposed: its session stays readable by session id,'
            " and ResumeAgent continues it",
            agent_id=agent_id,
        )
        self.agent_id = agent_id


class ResourceExhausted(AgentLoopError):
    """A configured limit was reached."""

    reason = "LIMIT_EXCEEDED"


class OutOfRange(AgentLoopError):
    """A position past the end of what exists (a sequence number never appended)."""

    reason = "SEQ_OUT_OF_RANGE"


class SessionDamaged(AgentLoopError):
    """A stored session (or the store itself) cannot be read."""

    reason = "SESSION_DAMAGED"

    def __init__(self, session_id: str, problem: str) -> None:
        what = f'session "{session_id}"' if session_id else "session store"
        super().__init__(f"{what} is damaged: {problem}", session_id=session_id)
        self.session_id = session_id


class Unavailable(AgentLoopError):
    """Not now: the same call may succeed after `retry_seconds` (outage, move, dependency)."""

    reason = "UNAVAILABLE"
    retry_seconds = 1.0
    """The delay a client should wait before retrying (`RetryInfo.retry_delay`)."""


class CodedError(Exception):
    """A failure with a machine-readable code, recorded on `turn/end` as `error.code`."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class TurnFatal(CodedError):
    """A failure that ends the turn `error` even where failures are usually results.

    A FAIL_CLOSED plugin failing at a tool seam raises it: the call gets a neutral
    error result (the model never sees the infrastructure detail) and the turn ends.
    """


class Aborted(Exception):
    """Raised where work stops because its abort signal fired."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
