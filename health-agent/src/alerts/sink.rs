//! The destinations that take each message as one JSON POST to a fixed URL — Slack, PagerDuty,
//! the generic webhook: one sink, paced, told by its destination's payload functions what to
//! send. Its URL is a secret: errors never show it (`Http::send`).

use serde_json::Value;

use super::{
    error::AlertError,
    http::{Http, Pacer},
    incident::Event,
};

/// The body one incident event becomes.
type EventPayload = Box<dyn Fn(&Event) -> Value + Send + Sync>;
/// The bodies `alert test` sends for a host, in order.
type TestPayloads = Box<dyn Fn(&str) -> Vec<Value> + Send + Sync>;

pub struct JsonSink {
    url: String,
    pacer: Pacer,
    event: EventPayload,
    test: TestPayloads,
}

impl JsonSink {
    pub fn new(
        url: &str,
        pacer: Pacer,
        event: impl Fn(&Event) -> Value + Send + Sync + 'static,
        test: impl Fn(&str) -> Vec<Value> + Send + Sync + 'static,
    ) -> Self {
        Self {
            url: url.to_string(),
            pacer,
            event: Box::new(event),
            test: Box::new(test),
        }
    }

    pub async fn deliver(&mut self, http: &Http, ev: &Event) -> Result<(), AlertError> {
        let body = (self.event)(ev);
        self.post(http, &body).await
    }

    pub async fn send_test(&mut self, http: &Http, host: &str) -> Result<(), AlertError> {
        for body in (self.test)(host) {
            self.post(http, &body).await?;
        }
        Ok(())
    }

    async fn post(&mut self, http: &Http, body: &Value) -> Result<(), AlertError> {
        let url = &self.url;
        http.send(&mut self.pacer, |c| c.post(url).json(body))
            .await
            .map(drop)
    }
}
