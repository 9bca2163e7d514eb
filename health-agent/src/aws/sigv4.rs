//! AWS Signature Version 4 for one request: the canonical request, the string to sign, the
//! derived signing key and the `Authorization` header. Written against AWS's published
//! SigV4 test suite (the vectors in the tests below) rather than pulled from the AWS SDK.

use ring::{digest, hmac};
use time::{macros::format_description, OffsetDateTime};

/// Access keys: from the environment or the instance role. `Debug` never shows the secret or
/// the token (they would end up in a log line).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &"<redacted>")
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// What is signed. `headers` are every header sent besides `host`, `x-amz-date` and
/// `x-amz-security-token` (which the signer adds); `query` is already canonical (sorted,
/// encoded).
pub struct Request<'a> {
    pub method: &'a str,
    /// `host` or `host:port` exactly as the Host header carries it.
    pub host: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub payload: &'a [u8],
}

/// The headers to add to the request, and the intermediate strings (for the test vectors).
/// No `Debug`: the canonical request holds the session token.
pub struct Signed {
    pub amz_date: String,
    pub authorization: String,
    pub canonical_request: String,
    pub string_to_sign: String,
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac(key: &[u8], data: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
}

/// kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request").
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(k_date.as_ref(), region.as_bytes());
    let k_service = hmac(k_region.as_ref(), service.as_bytes());
    hmac(k_service.as_ref(), b"aws4_request").as_ref().to_vec()
}

/// Header values are trimmed and inner runs of spaces collapse to one.
fn canonical_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn sign(
    creds: &Credentials,
    region: &str,
    service: &str,
    at: OffsetDateTime,
    req: &Request<'_>,
) -> Signed {
    let at = at.to_offset(time::UtcOffset::UTC);
    let amz_date = at
        .format(format_description!(
            "[year][month][day]T[hour][minute][second]Z"
        ))
        .unwrap_or_default();
    let date = &amz_date[..8.min(amz_date.len())];

    let mut headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), canonical_value(v)))
        .collect();
    headers.push(("host".into(), req.host.to_string()));
    headers.push(("x-amz-date".into(), amz_date.clone()));
    if let Some(token) = &creds.session_token {
        headers.push(("x-amz-security-token".into(), token.clone()));
    }
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        req.path,
        req.query,
        canonical_headers,
        signed_headers,
        sha256_hex(req.payload)
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let key = signing_key(&creds.secret_access_key, date, region, service);
    let signature = hex(hmac(&key, string_to_sign.as_bytes()).as_ref());
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key_id
    );
    Signed {
        amz_date,
        authorization,
        canonical_request,
        string_to_sign,
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    /// The credentials, date, region and service of AWS's SigV4 test suite.
    fn suite() -> (Credentials, OffsetDateTime) {
        (
            Credentials {
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
                session_token: None,
            },
            datetime!(2015-08-30 12:36:00 UTC),
        )
    }

    fn signed(req: &Request<'_>) -> Signed {
        let (creds, at) = suite();
        sign(&creds, "us-east-1", "service", at, req)
    }

    #[test]
    fn derives_the_documented_signing_key() {
        // AWS's "deriving the signing key" example (IAM, 2012-02-15).
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex(&key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn suite_post_x_www_form_urlencoded() {
        let s = signed(&Request {
            method: "POST",
            host: "example.amazonaws.com",
            path: "/",
            query: "",
            headers: &[("Content-Type", "application/x-www-form-urlencoded")],
            payload: b"Param1=value1",
        });
        assert_eq!(
            s.canonical_request,
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n\
             x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n\
             9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
        );
        assert_eq!(
            s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n\
             42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281"
        );
        assert_eq!(
            s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
        );
        assert_eq!(s.amz_date, "20150830T123600Z");
    }

    #[test]
    fn suite_post_vanilla_and_query() {
        let s = signed(&Request {
            method: "POST",
            host: "example.amazonaws.com",
            path: "/",
            query: "",
            headers: &[],
            payload: b"",
        });
        assert!(s.authorization.ends_with(
            "SignedHeaders=host;x-amz-date, \
             Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        ));
        let s = signed(&Request {
            method: "POST",
            host: "example.amazonaws.com",
            path: "/",
            query: "Param1=value1",
            headers: &[],
            payload: b"",
        });
        assert!(s.authorization.ends_with(
            "Signature=28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"
        ));
    }

    #[test]
    fn a_session_token_is_signed_and_nothing_secret_is_shown() {
        let (mut creds, at) = suite();
        creds.session_token = Some("TOKEN-SECRET".into());
        let s = sign(
            &creds,
            "us-east-1",
            "monitoring",
            at,
            &Request {
                method: "POST",
                host: "127.0.0.1:4566",
                path: "/",
                query: "",
                headers: &[("content-type", "application/x-www-form-urlencoded")],
                payload: b"Action=PutMetricData",
            },
        );
        assert!(s
            .authorization
            .contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,"));
        assert!(s.canonical_request.contains("host:127.0.0.1:4566\n"));
        let shown = format!("{} {creds:?}", s.authorization);
        assert!(!shown.contains("TOKEN-SECRET"), "{shown}");
        assert!(!shown.contains("EXAMPLEKEY"), "{shown}");
    }
}
