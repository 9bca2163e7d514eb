//! The members of this instance's own auto-scaling group as its peers (`fleet.peers_from =
//! "asg"`). The group comes from the instance metadata (the `aws:autoscaling:groupName` tag, else
//! `DescribeAutoScalingInstances` of this instance), its InService members from
//! `DescribeAutoScalingGroups`, their private addresses from `DescribeInstances`; each is asked
//! at this agent's own port, and this instance itself never.
//!
//! Listing runs on a task of its own every `fleet.peers_refresh`; a round of asking only reads
//! the last list, so neither a round nor `/health` ever waits on AWS. A failed listing keeps the
//! last good list for a bounded time and says so (a degraded fleet view, never a wrong answer).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::Mutex as AsyncMutex;
use url::form_urlencoded;

use crate::{
    aws::{
        credentials::Provider,
        endpoint,
        imds::{Imds, ImdsError},
        query::{self, QueryError, Service},
        sigv4::Credentials,
        xml::{self, Element},
    },
    config::FleetConfig,
    text,
};

/// Per AWS request (metadata, credentials, each Describe call).
const AWS_TIMEOUT: Duration = Duration::from_secs(5);
/// After a failed listing, the next try comes this soon (unless throttled: then a full
/// `peers_refresh` later).
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// A list is kept through failures for `KEEP_REFRESHES` refreshes, and at least `KEEP_MIN`:
/// instances come and go, so an old list asks the wrong peers.
const KEEP_REFRESHES: u32 = 5;
const KEEP_MIN: Duration = Duration::from_secs(300);
/// Instance ids per `DescribeInstances` filter (AWS allows 200 values per filter).
const IDS_PER_CALL: usize = 100;

/// Why the group's members could not be listed. The messages carry no key or token: AWS's
/// error text has them cut out (`aws::query::classify`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsgError {
    #[error("listing the auto-scaling group for the first time")]
    NotYet,
    #[error("cannot find this instance's {what}: {reason}")]
    Metadata { what: &'static str, reason: String },
    /// Neither keys in the environment nor an instance role.
    #[error("{0}")]
    Credentials(String),
    #[error("instance {instance} is in no auto-scaling group (DescribeAutoScalingInstances)")]
    NotInGroup { instance: String },
    #[error("auto-scaling group {group:?} not found (DescribeAutoScalingGroups)")]
    GroupGone { group: String },
    #[error("{action}: {error}{hint}")]
    Api {
        action: &'static str,
        error: String,
        hint: &'static str,
        throttled: bool,
    },
    #[error("{action}: {reason}")]
    Answer {
        action: &'static str,
        reason: String,
    },
    /// Listing failed; the last good list is still asked.
    #[error("listing failed, asking the {peers} peer(s) listed {age_s} s ago: {error}")]
    Stale {
        peers: usize,
        age_s: u64,
        error: Box<AsgError>,
    },
    /// Listing has failed for longer than a list is kept.
    #[error("listing has failed for {age_s} s, the last list is dropped: {error}")]
    Expired { age_s: u64, error: Box<AsgError> },
}

impl AsgError {
    fn api(action: &'static str, e: &QueryError) -> Self {
        let hint = match e.code() {
            "AccessDenied" | "AccessDeniedException" | "UnauthorizedOperation" => {
                " — the instance role needs autoscaling:DescribeAutoScalingGroups, \
                 autoscaling:DescribeAutoScalingInstances and ec2:DescribeInstances"
            }
            _ => "",
        };
        Self::Api {
            action,
            error: e.to_string(),
            hint,
            throttled: matches!(e, QueryError::Throttled { .. }),
        }
    }
}

/// The last good list and how the listing goes.
#[derive(Default)]
struct State {
    listed: Option<Listed>,
    /// The latest listing's failure; cleared by a success.
    error: Option<AsgError>,
    running: bool,
    /// When the next listing is due; None: at once.
    next: Option<Instant>,
}

#[derive(Clone)]
struct Listed {
    group: String,
    peers: Vec<String>,
    at: Instant,
}

/// The group's members, listed in the background.
pub struct AsgPeers {
    lister: Arc<AsyncMutex<Lister>>,
    state: Arc<Mutex<State>>,
    refresh: Duration,
    keep: Duration,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A panic while holding it leaves a plain list behind: still usable.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl AsgPeers {
    /// Peers at `port`, this agent's own. Credentials and the metadata service come from the
    /// environment as for CloudWatch; nothing is asked until the first `peers()`.
    pub fn new(cfg: &FleetConfig, port: u16) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(AWS_TIMEOUT)
            .connect_timeout(AWS_TIMEOUT)
            .build()?;
        let imds = Arc::new(Imds::from_env(AWS_TIMEOUT));
        let provider = Provider::from_env(imds.clone(), "");
        Ok(Self {
            lister: Arc::new(AsyncMutex::new(Lister {
                imds,
                provider,
                http,
                endpoint: cfg.aws_endpoint.clone(),
                port,
                own: None,
            })),
            state: Arc::new(Mutex::new(State::default())),
            refresh: cfg.peers_refresh,
            keep: (cfg.peers_refresh * KEEP_REFRESHES).max(KEEP_MIN),
        })
    }

    /// The last good list, `host:port` each, with a warning when it is stale; an error when
    /// there is none to use. Starts a listing in the background when one is due.
    pub fn peers(&self) -> Result<(Vec<String>, Option<AsgError>), AsgError> {
        self.start_listing();
        let s = lock(&self.state);
        let Some(listed) = &s.listed else {
            return Err(s.error.clone().unwrap_or(AsgError::NotYet));
        };
        let Some(error) = &s.error else {
            return Ok((listed.peers.clone(), None));
        };
        let age = listed.at.elapsed();
        if age > self.keep {
            return Err(AsgError::Expired {
                age_s: age.as_secs(),
                error: Box::new(error.clone()),
            });
        }
        let stale = AsgError::Stale {
            peers: listed.peers.len(),
            age_s: age.as_secs(),
            error: Box::new(error.clone()),
        };
        Ok((listed.peers.clone(), Some(stale)))
    }

    fn start_listing(&self) {
        {
            let mut s = lock(&self.state);
            if s.running || s.next.is_some_and(|t| Instant::now() < t) {
                return;
            }
            s.running = true;
        }
        let (lister, state, refresh) = (self.lister.clone(), self.state.clone(), self.refresh);
        tokio::spawn(async move {
            let result = lister.lock().await.list().await;
            let mut s = lock(&state);
            s.running = false;
            let after = match result {
                Ok(listed) => {
                    let changed = s.listed.as_ref().map(|l| (&l.group, &l.peers))
                        != Some((&listed.group, &listed.peers));
                    if changed || s.error.is_some() {
                        // The group's name and the addresses come from AWS: one line, no escapes.
                        tracing::info!(
                            "fleet: auto-scaling group {}: {} peer(s) in service: {}",
                            text::clean(&listed.group),
                            listed.peers.len(),
                            text::clean(&listed.peers.join(", "))
                        );
                    }
                    s.listed = Some(listed);
                    s.error = None;
                    refresh
                }
                Err(e) => {
                    if s.error.as_ref() != Some(&e) {
                        tracing::warn!(
                            "fleet: auto-scaling group peers: {}",
                            text::clean(&e.to_string())
                        );
                    }
                    let throttled = matches!(
                        e,
                        AsgError::Api {
                            throttled: true,
                            ..
                        }
                    );
                    s.error = Some(e);
                    if throttled {
                        refresh
                    } else {
                        RETRY_AFTER.min(refresh)
                    }
                }
            };
            // Instances started together do not list together.
            s.next = Some(Instant::now() + after.mul_f64(0.9 + fastrand::f64() * 0.2));
        });
    }
}

/// This instance, as the listing needs it.
#[derive(Clone)]
struct Own {
    instance: String,
    region: String,
    group: String,
}

/// The two APIs asked.
#[derive(Clone, Copy)]
enum Api {
    AutoScaling,
    Ec2,
}

impl Api {
    /// (the service, API version).
    fn service(self) -> (endpoint::Service, &'static str) {
        match self {
            Self::AutoScaling => (endpoint::Service::AutoScaling, "2011-01-01"),
            Self::Ec2 => (endpoint::Service::Ec2, "2016-11-15"),
        }
    }
}

struct Lister {
    imds: Arc<Imds>,
    provider: Provider,
    http: reqwest::Client,
    /// `fleet.aws_endpoint`; "" = the environment's, else the region's (aws::endpoint).
    endpoint: String,
    port: u16,
    /// Found once: an instance does not change its group or region.
    own: Option<Own>,
}

impl Lister {
    async fn list(&mut self) -> Result<Listed, AsgError> {
        let creds = self
            .provider
            .get()
            .await
            .map_err(|e| AsgError::Credentials(e.to_string()))?;
        let own = self.own(&creds).await?;
        let members = match self.members(&own, &creds).await {
            Ok(m) => m,
            Err(e) => {
                if matches!(e, AsgError::GroupGone { .. }) {
                    // Found again next time, should the metadata have been wrong.
                    self.own = None;
                }
                return Err(e);
            }
        };
        let mut peers: Vec<String> = self
            .addresses(&own, &creds, &members)
            .await?
            .into_iter()
            // One that is no IP address (a listing gone wrong) is kept as given: the round
            // checks every address (`addr::admit`: from here, IP addresses only), drops it and
            // says so.
            .map(|ip| match ip.parse() {
                Ok(ip) => super::addr::join(ip, self.port),
                Err(_) => format!("{ip}:{}", self.port),
            })
            .collect();
        peers.sort();
        Ok(Listed {
            group: own.group,
            peers,
            at: Instant::now(),
        })
    }

    /// This instance's id, region and group: from the metadata, the group from its tag, else
    /// from `DescribeAutoScalingInstances` (instance metadata tags may be off).
    async fn own(&mut self, creds: &Credentials) -> Result<Own, AsgError> {
        if let Some(own) = &self.own {
            return Ok(own.clone());
        }
        let meta = |what: &'static str| {
            move |e: ImdsError| AsgError::Metadata {
                what,
                reason: e.to_string(),
            }
        };
        let instance = self
            .imds
            .get("instance-id")
            .await
            .map_err(meta("instance id"))?;
        let region = crate::aws::region("", &self.imds)
            .await
            .map_err(meta("region (or set AWS_REGION)"))?;
        let group = match self
            .imds
            .get("tags/instance/aws:autoscaling:groupName")
            .await
        {
            Ok(g) if !g.is_empty() => g,
            Ok(_) | Err(ImdsError::NotFound { .. }) => {
                let params = [("InstanceIds.member.1".to_string(), instance.clone())];
                let partial = Own {
                    instance: instance.clone(),
                    region: region.clone(),
                    group: String::new(),
                };
                let answer = self
                    .call(
                        Api::AutoScaling,
                        "DescribeAutoScalingInstances",
                        &partial,
                        creds,
                        &params,
                    )
                    .await?;
                answer
                    .at(&[
                        "DescribeAutoScalingInstancesResult",
                        "AutoScalingInstances",
                        "member",
                    ])
                    .and_then(|m| m.text_of("AutoScalingGroupName"))
                    .filter(|g| !g.is_empty())
                    .ok_or_else(|| AsgError::NotInGroup {
                        instance: instance.clone(),
                    })?
                    .to_string()
            }
            Err(e) => return Err(meta("auto-scaling group")(e)),
        };
        let own = Own {
            instance,
            region,
            group,
        };
        self.own = Some(own.clone());
        Ok(own)
    }

    /// The group's InService instances, this one left out.
    async fn members(&mut self, own: &Own, creds: &Credentials) -> Result<Vec<String>, AsgError> {
        const ACTION: &str = "DescribeAutoScalingGroups";
        let params = [(
            "AutoScalingGroupNames.member.1".to_string(),
            own.group.clone(),
        )];
        let answer = self
            .call(Api::AutoScaling, ACTION, own, creds, &params)
            .await?;
        let group = answer
            .at(&[
                "DescribeAutoScalingGroupsResult",
                "AutoScalingGroups",
                "member",
            ])
            .ok_or_else(|| AsgError::GroupGone {
                group: own.group.clone(),
            })?;
        Ok(in_service(group, &own.instance))
    }

    /// The private IPv4 addresses of `ids` (those that have one yet).
    async fn addresses(
        &mut self,
        own: &Own,
        creds: &Credentials,
        ids: &[String],
    ) -> Result<Vec<String>, AsgError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(IDS_PER_CALL) {
            // A filter, not InstanceId.N: an id that just went away is left out instead of
            // failing the whole call (InvalidInstanceID.NotFound).
            let mut params = vec![("Filter.1.Name".to_string(), "instance-id".to_string())];
            for (i, id) in chunk.iter().enumerate() {
                params.push((format!("Filter.1.Value.{}", i + 1), id.clone()));
            }
            loop {
                let answer = self
                    .call(Api::Ec2, "DescribeInstances", own, creds, &params)
                    .await?;
                out.extend(private_addresses(&answer));
                match answer.text_of("nextToken").filter(|t| !t.is_empty()) {
                    Some(next) => {
                        let next = next.to_string();
                        params.retain(|(k, _)| k != "NextToken");
                        params.push(("NextToken".into(), next));
                    }
                    None => break,
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// One signed call; the answer's XML. Keys the service refused are fetched anew next time.
    async fn call(
        &mut self,
        api: Api,
        action: &'static str,
        own: &Own,
        creds: &Credentials,
        params: &[(String, String)],
    ) -> Result<Element, AsgError> {
        let (service, version) = api.service();
        let (endpoint, _) = endpoint::resolve(service, &self.endpoint, &own.region, &|k| {
            std::env::var(k).ok()
        })
        .map_err(|e| AsgError::Answer {
            action,
            reason: format!("endpoint: {e}"),
        })?;
        let service = Service {
            endpoint,
            region: own.region.clone(),
            name: service.signing_name(),
        };
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action);
            form.append_pair("Version", version);
            for (k, v) in params {
                form.append_pair(k, v);
            }
            form.finish()
        };
        let text = match query::call(&self.http, &service, creds, body).await {
            Ok(t) => t,
            Err(e) => {
                if matches!(e, QueryError::Credentials { .. }) {
                    self.provider.invalidate();
                }
                return Err(AsgError::api(action, &e));
            }
        };
        xml::parse(&text).map_err(|e| AsgError::Answer {
            action,
            reason: e.to_string(),
        })
    }
}

/// `Instances/member` of one group: the ids whose LifecycleState is InService, `own` left out.
fn in_service(group: &Element, own: &str) -> Vec<String> {
    let Some(instances) = group.child("Instances") else {
        return Vec::new();
    };
    instances
        .children("member")
        .filter(|m| m.text_of("LifecycleState") == Some("InService"))
        .filter_map(|m| m.text_of("InstanceId"))
        .filter(|id| !id.is_empty() && *id != own)
        .map(str::to_string)
        .collect()
}

/// Each instance's own `privateIpAddress` in a DescribeInstances answer (not its network
/// interfaces', which repeat the name one level down).
fn private_addresses(answer: &Element) -> Vec<String> {
    let Some(reservations) = answer.child("reservationSet") else {
        return Vec::new();
    };
    reservations
        .children("item")
        .filter_map(|r| r.child("instancesSet"))
        .flat_map(|set| set.children("item"))
        .filter_map(|i| i.text_of("privateIpAddress"))
        .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_in_service_members_other_than_this_one() {
        let doc = "<DescribeAutoScalingGroupsResponse><DescribeAutoScalingGroupsResult>\
            <AutoScalingGroups><member><AutoScalingGroupName>web</AutoScalingGroupName>\
            <Instances>\
              <member><InstanceId>i-a</InstanceId><LifecycleState>InService</LifecycleState></member>\
              <member><InstanceId>i-self</InstanceId><LifecycleState>InService</LifecycleState></member>\
              <member><InstanceId>i-b</InstanceId><LifecycleState>Standby</LifecycleState></member>\
              <member><InstanceId>i-c</InstanceId><LifecycleState>Pending</LifecycleState></member>\
              <member><InstanceId>i-d</InstanceId><LifecycleState>Terminating</LifecycleState></member>\
              <member><InstanceId>i-e</InstanceId><LifecycleState>InService</LifecycleState></member>\
            </Instances></member></AutoScalingGroups>\
            </DescribeAutoScalingGroupsResult></DescribeAutoScalingGroupsResponse>";
        let root = xml::parse(doc).unwrap();
        let group = root
            .at(&[
                "DescribeAutoScalingGroupsResult",
                "AutoScalingGroups",
                "member",
            ])
            .unwrap();
        assert_eq!(in_service(group, "i-self"), ["i-a", "i-e"]);
    }

    #[test]
    fn each_instance_its_own_private_address() {
        let doc = "<DescribeInstancesResponse><reservationSet>\
            <item><instancesSet>\
              <item><instanceId>i-a</instanceId>\
                <networkInterfaceSet><item><privateIpAddress>10.9.0.1</privateIpAddress></item></networkInterfaceSet>\
                <privateIpAddress>10.0.0.1</privateIpAddress></item>\
              <item><instanceId>i-pending</instanceId></item>\
            </instancesSet></item>\
            <item><instancesSet><item><instanceId>i-b</instanceId>\
              <privateIpAddress>10.0.0.2</privateIpAddress></item></instancesSet></item>\
            </reservationSet></DescribeInstancesResponse>";
        let root = xml::parse(doc).unwrap();
        assert_eq!(private_addresses(&root), ["10.0.0.1", "10.0.0.2"]);
    }

    #[tokio::test]
    async fn a_failed_listing_keeps_the_last_list_for_a_bounded_time_and_says_so() {
        let cfg = FleetConfig {
            peers_refresh: Duration::from_secs(10),
            ..FleetConfig::default()
        };
        let asg = AsgPeers::new(&cfg, 8080).unwrap();
        let failure = AsgError::Api {
            action: "DescribeAutoScalingGroups",
            error: "cannot connect".into(),
            hint: "",
            throttled: false,
        };
        let set = |age: Duration, error: Option<AsgError>| {
            let mut s = lock(&asg.state);
            // No listing starts: this test sets what one would have left.
            s.running = true;
            s.listed = Some(Listed {
                group: "web".into(),
                peers: vec!["10.0.0.2:8080".into()],
                at: Instant::now() - age,
            });
            s.error = error;
        };
        set(Duration::from_secs(30), None);
        assert_eq!(asg.peers(), Ok((vec!["10.0.0.2:8080".to_string()], None)));
        set(Duration::from_secs(30), Some(failure.clone()));
        let (peers, stale) = asg.peers().unwrap();
        assert_eq!(peers, ["10.0.0.2:8080"]);
        let said = stale.unwrap().to_string();
        assert!(
            said.contains("listing failed, asking the 1 peer(s) listed 30 s ago")
                && said.contains("cannot connect"),
            "{said}"
        );
        // Kept for 5 refreshes, at least 5 minutes.
        set(KEEP_MIN + Duration::from_secs(1), Some(failure));
        let e = asg.peers().unwrap_err();
        assert!(matches!(e, AsgError::Expired { .. }), "{e}");
        assert!(e.to_string().contains("the last list is dropped"), "{e}");
        lock(&asg.state).listed = None;
        lock(&asg.state).error = None;
        assert_eq!(asg.peers(), Err(AsgError::NotYet));
    }

    #[test]
    fn access_denied_names_the_permissions() {
        let e = query::classify(
            reqwest::StatusCode::FORBIDDEN,
            "<ErrorResponse><Error><Code>AccessDenied</Code><Message>User ASIAQEXAMPLE7KEY2IDX \
             is not authorized</Message></Error></ErrorResponse>",
        );
        let shown = AsgError::api("DescribeAutoScalingGroups", &e).to_string();
        assert!(
            shown.contains("autoscaling:DescribeAutoScalingGroups")
                && shown.contains("ec2:DescribeInstances")
                && !shown.contains("ASIAQ"),
            "{shown}"
        );
    }
}
