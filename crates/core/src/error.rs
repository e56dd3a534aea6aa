//! The one error type of the core crate, and the stable error codes every service and the wire
//! share. `ErrorCode::retryable` is the single place that decides between retrying and failing.

use std::fmt;

/// A stable, wire-visible error code. The string form is what travels in `hermes.v1.Error.code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument,
    PlanInvalid,
    NotFound,
    FailedPrecondition,
    Unavailable,
    Timeout,
    ToolError,
    LlmParseError,
    BudgetExceeded,
    Denied,
    NoProgress,
    NoCapableAgent,
    PoisonMessage,
    Cancelled,
    LimitExceeded,
    Unauthenticated,
    Internal,
}

impl ErrorCode {
    /// Every code, for documentation and round-trip tests.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::InvalidArgument,
        ErrorCode::PlanInvalid,
        ErrorCode::NotFound,
        ErrorCode::FailedPrecondition,
        ErrorCode::Unavailable,
        ErrorCode::Timeout,
        ErrorCode::ToolError,
        ErrorCode::LlmParseError,
        ErrorCode::BudgetExceeded,
        ErrorCode::Denied,
        ErrorCode::NoProgress,
        ErrorCode::NoCapableAgent,
        ErrorCode::PoisonMessage,
        ErrorCode::Cancelled,
        ErrorCode::LimitExceeded,
        ErrorCode::Unauthenticated,
        ErrorCode::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::PlanInvalid => "PLAN_INVALID",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::FailedPrecondition => "FAILED_PRECONDITION",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::ToolError => "TOOL_ERROR",
            ErrorCode::LlmParseError => "LLM_PARSE_ERROR",
            ErrorCode::BudgetExceeded => "BUDGET_EXCEEDED",
            ErrorCode::Denied => "DENIED",
            ErrorCode::NoProgress => "NO_PROGRESS",
            ErrorCode::NoCapableAgent => "NO_CAPABLE_AGENT",
            ErrorCode::PoisonMessage => "POISON_MESSAGE",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::LimitExceeded => "LIMIT_EXCEEDED",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    pub fn parse(code: &str) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// Whether a failure with this code is worth another attempt. Only transient failures are:
    /// a tool error is deterministic and would fail the same way again.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::Timeout | ErrorCode::LlmParseError | ErrorCode::Unavailable)
    }

    /// The gRPC status code a client sees for this error.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::InvalidArgument | ErrorCode::PlanInvalid => tonic::Code::InvalidArgument,
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::FailedPrecondition | ErrorCode::NoCapableAgent => tonic::Code::FailedPrecondition,
            ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::Timeout => tonic::Code::DeadlineExceeded,
            ErrorCode::Denied => tonic::Code::PermissionDenied,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::BudgetExceeded | ErrorCode::LimitExceeded => tonic::Code::ResourceExhausted,
            ErrorCode::Cancelled => tonic::Code::Cancelled,
            ErrorCode::ToolError
            | ErrorCode::LlmParseError
            | ErrorCode::NoProgress
            | ErrorCode::PoisonMessage
            | ErrorCode::Internal => tonic::Code::Internal,
        }
    }
}

impl ErrorCode {
    /// The HTTP status the HTTP API answers with for this error (docs/http.md).
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::PlanInvalid => 422,
            ErrorCode::NotFound => 404,
            ErrorCode::FailedPrecondition | ErrorCode::NoCapableAgent | ErrorCode::Cancelled => 409,
            ErrorCode::Denied => 403,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::BudgetExceeded | ErrorCode::LimitExceeded => 429,
            ErrorCode::Timeout => 504,
            ErrorCode::Unavailable => 503,
            ErrorCode::ToolError
            | ErrorCode::LlmParseError
            | ErrorCode::NoProgress
            | ErrorCode::PoisonMessage
            | ErrorCode::Internal => 500,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the shared layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `reason` is the client's error with every credential of the URL taken out (the client's
    /// own text may quote the URL it was given), so the error prints safely.
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect {
        url: crate::secret::SecretUrl,
        reason: String,
        /// The server refused the credentials (an authorization violation), as opposed to not
        /// answering: an agent whose identity the registry has not admitted yet tries again.
        refused: bool,
    },
    #[error("nats-server {found} is too old: Hermes needs {required} or later")]
    ServerTooOld { found: String, required: String },
    #[error("JetStream {operation} failed: {reason}")]
    JetStream { operation: &'static str, reason: String },
    #[error("publish to {subject} failed: {reason}")]
    Publish { subject: String, reason: String },
    #[error("cannot decode {kind}: {reason}")]
    Decode { kind: &'static str, reason: String },
    #[error("invalid plan: {}", .problems.join("; "))]
    PlanInvalid { problems: Vec<String> },
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("{what} not found: {id}")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("denied: {reason}")]
    Denied { reason: String },
    #[error("{0} is unavailable")]
    Unavailable(String),
    #[error("timed out after {elapsed_ms} ms: {what}")]
    Timeout { what: String, elapsed_ms: u64 },
    /// A per-client or per-request limit was reached.
    #[error("{0}")]
    LimitExceeded(String),
    /// The caller did not say who it is, or said it with a credential nobody knows.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// A tenant's quota is spent; trying again after `retry_after_secs` may succeed.
    #[error("quota exceeded: {reason}; retry after {retry_after_secs} s")]
    QuotaExceeded { reason: String, retry_after_secs: u64 },
}

/// Result alias with the core error as default.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Connect { .. } | Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::ServerTooOld { .. } | Error::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            Error::JetStream { .. } | Error::Publish { .. } => ErrorCode::Unavailable,
            Error::Decode { .. } => ErrorCode::InvalidArgument,
            Error::PlanInvalid { .. } => ErrorCode::PlanInvalid,
            Error::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Error::NotFound { .. } => ErrorCode::NotFound,
            Error::Denied { .. } => ErrorCode::Denied,
            Error::Timeout { .. } => ErrorCode::Timeout,
            Error::LimitExceeded(_) | Error::QuotaExceeded { .. } => ErrorCode::LimitExceeded,
            Error::Unauthenticated(_) => ErrorCode::Unauthenticated,
        }
    }

    /// How long to wait before trying again, when the error says (a spent quota).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Error::QuotaExceeded { retry_after_secs, .. } => Some(*retry_after_secs),
            _ => None,
        }
    }

    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }

    /// The wire form of this error.
    pub fn to_proto(&self) -> hermes_proto::Error {
        wire_error(self.code(), self.to_string())
    }

    pub(crate) fn jetstream(operation: &'static str, err: impl fmt::Display) -> Self {
        Error::JetStream { operation, reason: err.to_string() }
    }
}

/// Builds a wire error whose `retryable` flag follows the code.
pub fn wire_error(code: ErrorCode, message: impl Into<String>) -> hermes_proto::Error {
    hermes_proto::Error {
        code: code.as_str().to_owned(),
        message: message.into(),
        retryable: code.retryable(),
        node_id: String::new(),
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        let code = err.code();
        let mut status = tonic::Status::new(code.grpc_code(), format!("{code}: {err}"));
        // As HTTP's `Retry-After`: whole seconds.
        if let Some(secs) = err.retry_after_secs()
            && let Ok(value) = secs.to_string().parse()
        {
            status.metadata_mut().insert("retry-after", value);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_their_wire_form() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::parse("NOPE"), None);
    }

    #[test]
    fn only_transient_codes_are_retryable() {
        assert!(ErrorCode::Timeout.retryable());
        assert!(ErrorCode::LlmParseError.retryable());
        assert!(!ErrorCode::ToolError.retryable());
        assert!(!ErrorCode::InvalidArgument.retryable());
    }

    #[test]
    fn every_code_has_an_http_status_of_its_class() {
        for code in ErrorCode::ALL {
            let status = code.http_status();
            let client = matches!(
                code,
                ErrorCode::InvalidArgument
                    | ErrorCode::PlanInvalid
                    | ErrorCode::NotFound
                    | ErrorCode::FailedPrecondition
                    | ErrorCode::NoCapableAgent
                    | ErrorCode::Cancelled
                    | ErrorCode::Denied
                    | ErrorCode::Unauthenticated
                    | ErrorCode::BudgetExceeded
                    | ErrorCode::LimitExceeded
            );
            assert_eq!((400..500).contains(&status), client, "{code}: {status}");
            assert!((400..600).contains(&status), "{code}: {status}");
        }
        assert_eq!(ErrorCode::PlanInvalid.http_status(), 422);
        assert_eq!(ErrorCode::Unavailable.http_status(), 503);
    }

    #[test]
    fn status_carries_code_and_reason() {
        let status: tonic::Status = Error::PlanInvalid { problems: vec!["cycle a -> b -> a".into()] }.into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("PLAN_INVALID"));
        assert!(status.message().contains("cycle a -> b -> a"));
    }
}
