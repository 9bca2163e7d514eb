//! Why an alert, or `alert test`, did not reach its destination. Every text inside is fit to
//! show: no URL of the destination, and the reply only in its documented shapes (`redact`).

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlertError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    /// A 4xx other than a rate limit: retrying a rejected payload or a revoked key only
    /// repeats the rejection.
    #[error("rejected with {0} (not retried: fix the configuration)")]
    Rejected(String),
    /// The request could not be built (a malformed URL, say).
    #[error("{0}")]
    Request(String),
    #[error("gave up after {attempts} attempt{}: {last}", if *.attempts == 1 { "" } else { "s" })]
    GaveUp { attempts: u32, last: String },
    #[error("GitHub created the issue but its answer has no number")]
    NoIssueNumber,
    #[error("the token variable {0} is empty or unset (alerts.github_token_env)")]
    NoToken(String),
}
