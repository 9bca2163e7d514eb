//! The journal's line for each change of `/health`'s answer.

/// What the balancer sees: the code, the status and the web verdict.
pub type Answer = (u16, crate::status::Status, crate::status::WebVerdict);

/// One line per change of the answer, whether or not alerts are configured: INFO when it
/// turns healthy (or boots), WARN when it degrades, recovers or turns unhealthy.
pub fn log_answer_change(before: Option<Answer>, now: Answer, reasons: &[String]) {
    let line = answer_change_line(before, now, reasons);
    match now.1 {
        crate::status::Status::Healthy
        | crate::status::Status::Booting
        | crate::status::Status::Draining => {
            tracing::info!("{line}")
        }
        _ => tracing::warn!("{line}"),
    }
}

fn answer_change_line(before: Option<Answer>, now: Answer, reasons: &[String]) -> String {
    let show = |(code, status, web): Answer| {
        format!("{code} {}, webserver {}", status.as_str(), web.as_str())
    };
    let was = before.map_or("at start".to_string(), |b| format!("was {}", show(b)));
    let why = if reasons.is_empty() {
        String::new()
    } else {
        format!(": {}", reasons.join("; "))
    };
    format!("/health now {} ({was}){why}", show(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Status, WebVerdict};

    #[test]
    fn an_answer_change_reads_as_words_with_its_reason() {
        let line = answer_change_line(
            Some((200, Status::Healthy, WebVerdict::Up)),
            (503, Status::Unhealthy, WebVerdict::Hung),
            &["web backend hung: 3 connections wait".into()],
        );
        assert_eq!(
            line,
            "/health now 503 unhealthy, webserver hung (was 200 healthy, webserver up): \
             web backend hung: 3 connections wait"
        );
        let first = answer_change_line(None, (200, Status::Healthy, WebVerdict::Up), &[]);
        assert_eq!(first, "/health now 200 healthy, webserver up (at start)");
    }
}
