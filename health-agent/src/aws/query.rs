//! One signed call in AWS's Query protocol: a form-encoded POST (`Action=...&Version=...`) with
//! an XML answer, the protocol CloudWatch, Auto Scaling and EC2 all accept — real AWS and moto
//! alike. Errors are sorted into what a retry may fix and what it cannot, with the keys cut out
//! of any message AWS sends back.

use reqwest::{StatusCode, Url};

use super::{
    imds::without_url,
    sigv4::{self, Credentials},
};

const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// Error messages are cut to this many characters.
const SNIPPET: usize = 200;
/// An answer larger than this is refused (a thousand instances' descriptions fit many times).
const MAX_ANSWER: usize = 16 << 20;

#[derive(Debug, Clone, thiserror::Error)]
pub enum QueryError {
    /// Connection refused, reset, timed out: the service (or the way to it) is down or slow.
    #[error("{0}")]
    Transport(String),
    /// 429, or 400 `Throttling` / `RequestLimitExceeded`: too many requests.
    #[error("throttled: HTTP {status} {code}: {message}")]
    Throttled {
        status: u16,
        code: String,
        message: String,
    },
    /// 5xx.
    #[error("HTTP {status} {code}: {message}")]
    Server {
        status: u16,
        code: String,
        message: String,
    },
    /// The keys expired or are not known: new ones may fix it.
    #[error("credentials refused: HTTP {status} {code}: {message}")]
    Credentials {
        status: u16,
        code: String,
        message: String,
    },
    /// Any other 4xx (access denied, a bad parameter): the same request fails again.
    #[error("refused: HTTP {status} {code}: {message}")]
    Rejected {
        status: u16,
        code: String,
        message: String,
    },
}

impl QueryError {
    pub fn retryable(&self) -> bool {
        !matches!(self, Self::Rejected { .. })
    }

    /// The error code AWS sent (`AccessDenied`, `Throttling`...), if any.
    pub fn code(&self) -> &str {
        match self {
            Self::Transport(_) => "",
            Self::Throttled { code, .. }
            | Self::Server { code, .. }
            | Self::Credentials { code, .. }
            | Self::Rejected { code, .. } => code,
        }
    }
}

/// `<Tag>text</Tag>` from an XML error body (flat and small in every Query service).
fn xml_tag<'a>(body: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = body.find(&open)? + open.len();
    let len = body[start..].find(&format!("</{tag}>"))?;
    Some(body[start..start + len].trim())
}

/// `message` with every word shaped like an AWS credential shown as `<credential>`: an access
/// key id (`AKIA`/`ASIA` and 16 upper-case letters or digits) or a run of 30 or more base64
/// characters (a secret key, a session token). By shape, never by value: nothing here knows the
/// keys in use.
fn without_credentials(message: &str) -> String {
    let credential = |w: &str| {
        let key_id = w.len() == 20
            && (w.starts_with("AKIA") || w.starts_with("ASIA"))
            && w.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
        let blob = w.len() >= 30
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='));
        key_id || blob
    };
    let mut out = String::with_capacity(message.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if credential(word) {
            out.push_str("<credential>");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in message.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=') {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Sorts an error answer. An AWS error may quote the access key id ("The security token ...
/// AKIA..."), and no key belongs in a log line or a response: every word shaped like a
/// credential is cut out of the message ([`without_credentials`]), whatever its value.
pub fn classify(status: StatusCode, body: &str) -> QueryError {
    let code = xml_tag(body, "Code").unwrap_or("").to_string();
    let mut message: String = xml_tag(body, "Message")
        .unwrap_or(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(SNIPPET)
        .collect();
    message = without_credentials(&message);
    let status_u16 = status.as_u16();
    let code_lc = code.to_ascii_lowercase();
    if status == StatusCode::TOO_MANY_REQUESTS
        || code_lc.contains("throttl")
        || code_lc == "requestlimitexceeded"
    {
        QueryError::Throttled {
            status: status_u16,
            code,
            message,
        }
    } else if status.is_server_error() {
        QueryError::Server {
            status: status_u16,
            code,
            message,
        }
    } else if matches!(
        code.as_str(),
        "ExpiredToken"
            | "ExpiredTokenException"
            | "RequestExpired"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "AuthFailure"
    ) {
        QueryError::Credentials {
            status: status_u16,
            code,
            message,
        }
    } else {
        QueryError::Rejected {
            status: status_u16,
            code,
            message,
        }
    }
}

/// The Host header's value for `url`: the port only when it is not the scheme's default,
/// as reqwest sends it.
fn host_header(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// Where a call goes and how it is signed.
#[derive(Debug, Clone)]
pub struct Service {
    pub endpoint: Url,
    pub region: String,
    /// The service's name in the signature's scope: "monitoring", "autoscaling", "ec2".
    pub name: &'static str,
}

/// Sends one signed Query-protocol request with the form `body`; the answer's text on 2xx.
pub async fn call(
    http: &reqwest::Client,
    service: &Service,
    creds: &Credentials,
    body: String,
) -> Result<String, QueryError> {
    let host = host_header(&service.endpoint);
    let path = match service.endpoint.path() {
        "" => "/",
        p => p,
    };
    let signed = sigv4::sign(
        creds,
        &service.region,
        service.name,
        time::OffsetDateTime::now_utc(),
        &sigv4::Request {
            method: "POST",
            host: &host,
            path,
            query: "",
            headers: &[("content-type", CONTENT_TYPE)],
            payload: body.as_bytes(),
        },
    );
    let mut req = http
        .post(service.endpoint.clone())
        .header("x-amz-date", &signed.amz_date)
        .header("authorization", &signed.authorization);
    if let Some(token) = &creds.session_token {
        req = req.header("x-amz-security-token", token);
    }
    send(req, body).await
}

/// An unsigned Query-protocol request (STS `AssumeRoleWithWebIdentity` is one): the answer's
/// text on 2xx.
pub async fn call_unsigned(
    http: &reqwest::Client,
    endpoint: &Url,
    body: String,
) -> Result<String, QueryError> {
    send(http.post(endpoint.clone()), body).await
}

async fn send(req: reqwest::RequestBuilder, body: String) -> Result<String, QueryError> {
    let resp = req
        .header("content-type", CONTENT_TYPE)
        .body(body)
        .send()
        .await
        .map_err(|e| QueryError::Transport(without_url(&e)))?;
    let status = resp.status();
    let answer = crate::capped::body(resp, MAX_ANSWER)
        .await
        .map_err(|e| match e {
            crate::capped::CappedError::Transport(e) => QueryError::Transport(without_url(&e)),
            crate::capped::CappedError::TooLarge { .. } => QueryError::Transport(format!(
                "the answer is larger than {} MiB",
                MAX_ANSWER >> 20
            )),
        })?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    if status.is_success() {
        return Ok(text);
    }
    Err(classify(status, &text))
}

/// A service's public endpoint in a region (China's partition has its own domain):
/// `regional_endpoint("monitoring", "eu-west-1")`.
pub fn regional_endpoint(service: &str, region: &str) -> String {
    super::endpoint::regional(service, region)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_what_a_retry_can_fix() {
        let xml = |code: &str| {
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>\
                 <Message>key AKIAIOSFODNN7EXAMPLE (secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY) is bad</Message></Error></ErrorResponse>"
            )
        };
        let e = classify(StatusCode::BAD_REQUEST, &xml("Throttling"));
        assert!(
            matches!(e, QueryError::Throttled { .. }) && e.retryable(),
            "{e}"
        );
        // EC2's own spelling, in its own envelope.
        let ec2 = "<Response><Errors><Error><Code>RequestLimitExceeded</Code>\
                   <Message>Request limit exceeded.</Message></Error></Errors></Response>";
        let e = classify(StatusCode::SERVICE_UNAVAILABLE, ec2);
        assert!(matches!(e, QueryError::Throttled { .. }), "{e}");
        let e = classify(StatusCode::TOO_MANY_REQUESTS, "slow down");
        assert!(matches!(e, QueryError::Throttled { .. }), "{e}");
        let e = classify(StatusCode::SERVICE_UNAVAILABLE, "");
        assert!(matches!(e, QueryError::Server { .. }) && e.retryable());
        let e = classify(StatusCode::FORBIDDEN, &xml("ExpiredToken"));
        assert!(matches!(e, QueryError::Credentials { .. }) && e.retryable());
        let e = classify(StatusCode::FORBIDDEN, &xml("AccessDenied"));
        assert!(!e.retryable());
        assert_eq!(e.code(), "AccessDenied");
        let shown = e.to_string();
        assert!(
            shown.contains("AccessDenied")
                && shown.contains("key <credential> (secret <credential>) is bad")
                && !shown.contains("AKIA")
                && !shown.contains("EXAMPLEKEY"),
            "{shown}"
        );
    }

    #[test]
    fn regional_endpoints() {
        assert_eq!(
            regional_endpoint("monitoring", "cn-north-1"),
            "https://monitoring.cn-north-1.amazonaws.com.cn"
        );
        assert_eq!(
            regional_endpoint("autoscaling", "eu-west-1"),
            "https://autoscaling.eu-west-1.amazonaws.com"
        );
    }
}
