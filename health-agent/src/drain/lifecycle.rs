//! The auto-scaling group's termination hook (`[drain] lifecycle_hook`): the agent reads IMDSv2's
//! `autoscaling/target-lifecycle-state` every `lifecycle_poll`; once it says `Terminated` the
//! group has put this instance in `Terminating:Wait`, so the agent drains by itself and, once
//! drained (or at `lifecycle_timeout`), calls `CompleteLifecycleAction` with `CONTINUE`, signed
//! like the CloudWatch calls. The group then terminates the instance at once instead of waiting
//! out the hook's heartbeat timeout.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use url::form_urlencoded;

use super::{By, Drain, Judgement};
use crate::{
    aws::{
        credentials::Provider,
        endpoint,
        imds::{Imds, ImdsError},
        query::{self, QueryError, Service},
        xml,
    },
    config::DrainConfig,
};

/// Per request to the metadata service and the Auto Scaling API.
const AWS_TIMEOUT: Duration = Duration::from_secs(5);
/// The metadata path that says where the group is taking this instance.
pub const TARGET_STATE: &str = "autoscaling/target-lifecycle-state";
/// Tries of `CompleteLifecycleAction`, doubling the pause from one second: the action may not
/// be open yet the moment the metadata changes, and the API throttles.
const COMPLETE_TRIES: u32 = 6;
const API_VERSION: &str = "2011-01-01";

/// Could not complete the lifecycle action.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("instance metadata ({what}): {error}")]
    Metadata {
        what: &'static str,
        error: ImdsError,
    },
    #[error("credentials: {0}")]
    Credentials(String),
    #[error("CompleteLifecycleAction: {0}")]
    Api(QueryError),
    #[error("the Auto Scaling client: {0}")]
    Client(String),
    #[error(
        "no auto-scaling group: set [drain] auto_scaling_group, or enable instance metadata tags"
    )]
    NoGroup,
}

/// Watches the lifecycle state when a hook is configured; None otherwise.
pub fn spawn(
    cfg: &DrainConfig,
    drain: Drain,
    shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if cfg.lifecycle_hook.is_empty() {
        return None;
    }
    let cfg = cfg.clone();
    Some(tokio::spawn(async move {
        tokio::select! {
            _ = run(cfg, drain) => {}
            _ = shutdown.cancelled() => {}
        }
    }))
}

async fn run(cfg: DrainConfig, drain: Drain) {
    let imds = Arc::new(Imds::from_env(AWS_TIMEOUT));
    wait_for_termination(&cfg, &imds).await;
    tracing::warn!(
        "the auto-scaling group is terminating this instance (IMDS {TARGET_STATE} = Terminated): \
         draining, then CompleteLifecycleAction CONTINUE on hook {}",
        cfg.lifecycle_hook
    );
    if let Err(e) = drain.start(By::LifecycleHook) {
        tracing::warn!("{e}: draining anyway");
    }
    let since = std::time::Instant::now();
    let outcome = loop {
        match drain.judge(cfg.lifecycle_quiet, cfg.lifecycle_timeout, since) {
            Some(Judgement::Draining) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(Judgement::Drained(m)) => break m,
            Some(Judgement::TimedOut(m)) => {
                tracing::warn!("lifecycle hook: {m}; completing the action anyway");
                break m;
            }
            None => break "undrained by hand while the hook waited".to_string(),
        }
    };
    tracing::info!("lifecycle hook: {outcome}");
    let mut provider = Provider::from_env(imds.clone(), &cfg.region);
    let mut pause = Duration::from_secs(1);
    for attempt in 1..=COMPLETE_TRIES {
        match complete(&cfg, &imds, &mut provider).await {
            Ok((group, instance)) => {
                tracing::info!(
                    "CompleteLifecycleAction CONTINUE sent for {instance} (hook {} of group \
                     {group}) after: {outcome}",
                    cfg.lifecycle_hook
                );
                return;
            }
            Err(e) if attempt < COMPLETE_TRIES => {
                tracing::warn!(
                    "lifecycle hook: {e} (try {attempt} of {COMPLETE_TRIES}; again in {}s)",
                    pause.as_secs()
                );
                if matches!(e, HookError::Api(QueryError::Credentials { .. })) {
                    provider.invalidate();
                }
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(e) => tracing::error!(
                "lifecycle hook: {e}; giving up: the group terminates the instance at the \
                 hook's heartbeat timeout instead"
            ),
        }
    }
}

/// Returns once the metadata says `Terminated`. Other states (`InService`, `Standby`,
/// `Warmed:*`, `Detached`) and errors only wait; an error is logged when it changes.
async fn wait_for_termination(cfg: &DrainConfig, imds: &Imds) {
    let mut last_error: Option<String> = None;
    loop {
        match imds.get(TARGET_STATE).await {
            Ok(state) if state.trim() == "Terminated" => return,
            Ok(_) => last_error = None,
            Err(e) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(
                        "lifecycle hook {}: cannot read {TARGET_STATE}: {text}; reading it again \
                         every {}s",
                        cfg.lifecycle_hook,
                        cfg.lifecycle_poll.as_secs()
                    );
                    last_error = Some(text);
                }
            }
        }
        tokio::time::sleep(cfg.lifecycle_poll).await;
    }
}

/// One `CompleteLifecycleAction` CONTINUE; the group and instance it named.
async fn complete(
    cfg: &DrainConfig,
    imds: &Imds,
    provider: &mut Provider,
) -> Result<(String, String), HookError> {
    let meta = |what: &'static str| move |error: ImdsError| HookError::Metadata { what, error };
    let instance = imds.get("instance-id").await.map_err(meta("instance-id"))?;
    let region = crate::aws::region(&cfg.region, imds)
        .await
        .map_err(meta("region (or set AWS_REGION)"))?;
    let group = if cfg.auto_scaling_group.is_empty() {
        let g = imds
            .get("tags/instance/aws:autoscaling:groupName")
            .await
            .map_err(meta("tags/instance/aws:autoscaling:groupName"))?;
        if g.trim().is_empty() {
            return Err(HookError::NoGroup);
        }
        g.trim().to_string()
    } else {
        cfg.auto_scaling_group.clone()
    };
    let (endpoint, _) = endpoint::resolve(
        endpoint::Service::AutoScaling,
        &cfg.aws_endpoint,
        &region,
        &|k| std::env::var(k).ok(),
    )
    .map_err(|e| HookError::Client(e.to_string()))?;
    let service = Service {
        endpoint,
        region,
        name: endpoint::Service::AutoScaling.signing_name(),
    };
    let creds = provider
        .get()
        .await
        .map_err(|e| HookError::Credentials(e.to_string()))?;
    let http = reqwest::Client::builder()
        .timeout(AWS_TIMEOUT)
        .connect_timeout(AWS_TIMEOUT)
        .build()
        .map_err(|e| HookError::Client(crate::aws::imds::without_url(&e)))?;
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("Action", "CompleteLifecycleAction")
        .append_pair("Version", API_VERSION)
        .append_pair("AutoScalingGroupName", &group)
        .append_pair("LifecycleHookName", &cfg.lifecycle_hook)
        .append_pair("InstanceId", &instance)
        .append_pair("LifecycleActionResult", "CONTINUE")
        .finish();
    let answer = query::call(&http, &service, &creds, body)
        .await
        .map_err(HookError::Api)?;
    // A 2xx whose body is not the action's answer is no proof it was taken.
    match xml::parse(&answer) {
        Ok(doc) if doc.name.ends_with("CompleteLifecycleActionResponse") => Ok((group, instance)),
        _ => Err(HookError::Client(format!(
            "unexpected answer: {}",
            crate::text::cut(&answer, 200)
        ))),
    }
}
