//! An HTTP answer from outside the process (a peer, Consul, an AWS endpoint), read while it
//! streams and cut off at a cap: whatever the sender declares or sends, it costs at most the cap.

/// Why an answer was not read whole.
#[derive(Debug, thiserror::Error)]
pub enum CappedError {
    /// Declared or sent past the cap: not read on.
    #[error("an answer over {cap} bytes: cut off")]
    TooLarge { cap: usize },
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
}

/// The body of `resp`, refused as soon as it declares or grows past `cap` bytes.
pub async fn body(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, CappedError> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(CappedError::TooLarge { cap });
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if out.len() + chunk.len() > cap {
            return Err(CappedError::TooLarge { cap });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}
