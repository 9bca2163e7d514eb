//! The saturation as a CloudWatch metric, for the scaling group's target tracking: one
//! PutMetricData in the Query protocol (client.rs), and the task that samples, batches and
//! retries (publisher.rs). Signing, the instance metadata and credentials are `aws`'s.

pub mod client;
mod publisher;

pub use publisher::{start, Handle, Source, Status, Tuning};
