//! `health_agent_web_responses_total` and how it was made.

use super::Out;

/// The answers counter, exact or a scaled estimate, with its basis beside it (see
/// `checks::web::tally`).
pub(super) fn responses_total(o: &mut Out, w: &crate::checks::web::WebReport) {
    let Some(t) = &w.responses_total else {
        return;
    };
    o.labeled_float_counter(
        "web_responses",
        "Real answers of the web backend by status class, the probe path's left out: counted \
         with socket_tracing always, estimated from the counting windows otherwise (see \
         health_agent_web_responses_basis)",
        crate::checks::web::ANSWER_CLASSES
            .iter()
            .zip(t.by_class)
            .skip(1)
            .map(|(class, n)| (vec![("class", class.to_string())], n))
            .collect(),
    );
    o.state(
        "web_responses_basis",
        "How health_agent_web_responses_total is made: counted (exact) or estimated (the \
         counting windows' rate times the time passed)",
        "basis",
        &["counted", "estimated"],
        if t.counted { "counted" } else { "estimated" },
    );
    o.gauge(
        "web_responses_sample_ratio",
        "Share of the time the estimate rests on that the programs counted (1 when counted)",
        t.sample_ratio,
    );
}
