//! The saturation as a CloudWatch metric, for the scaling group's target tracking: SigV4
//! signing (sigv4.rs), IMDSv2 (imds.rs), credentials from the environment or the instance
//! role (credentials.rs), one PutMetricData in the Query protocol (client.rs), and the task
//! that samples, batches and retries (publisher.rs). No AWS SDK: one API call does not
//! justify its size and compile time, and reqwest with rustls is already in the tree.

pub mod client;
pub mod credentials;
pub mod imds;
mod publisher;
pub mod sigv4;

pub use publisher::{start, Handle, Source, Status, Tuning};
