//! Fleet-wide incidents. A fault the fleet shares (an infrastructure issue the peers judged
//! shared) is one incident for the whole fleet — one PagerDuty incident, one GitHub issue, one
//! Slack message — raised and resolved by one agent the fleet agrees on: its *reporter*. A
//! fault of this host's own stays this host's incident.
//!
//! Every agent holding such an incident open says so in its peer view (`PeerView::alerts`):
//! whom it takes for the reporter and how fresh that word is, and where the trigger is. The
//! reporter is the lowest instance id among the agents known to hold the incident open: this
//! one, each peer whose view holds it, and the reporter each of those names — each heard
//! within `lease`. Then:
//! - a new incident waits `settle` (a whole round of asking after this agent joined it) before
//!   its reporter sends the trigger, so that every agent has heard of the others first;
//! - a trigger that went out, or that an agent still heard is delivering, is not sent again: a
//!   late agent with a lower id takes over the resolve, not the trigger;
//! - a reporter unheard of for `lease` (killed, cut off) is gone: the next lowest takes over,
//!   and sends the trigger itself if it had not gone out;
//! - the reporter whose own fault cleared keeps the incident open while it hears any agent
//!   still holding it, then sends the one resolve; the others close theirs without a word.
//!
//! In a fleet larger than `fleet.sample + 1` each agent hears a sample of its peers a round;
//! the reporter each peer names spreads the lowest id through the samples, but two agents can
//! still both take themselves for the reporter at the start: PagerDuty folds the second
//! trigger into the first (same `dedup_key`), GitHub's comes as a comment on the same issue
//! (found by its fingerprint), Slack gets two messages.

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
    time::{Duration, Instant, SystemTime},
};

use super::incident::{Condition, Event, FleetTag, Kind, Transition};
use crate::{
    config::FleetConfig,
    fleet::{HeldClaim, PeerAlerts, TriggerState, Witness},
};

/// The fleet's name in its incidents' keys: `fleet.name`, else the Consul service, else the
/// `peers_dns` name without its port, else `fleet` — the same on every agent of one config.
pub fn name(cfg: &FleetConfig) -> String {
    let dns = cfg
        .peers_dns
        .rsplit_once(':')
        .filter(|(_, port)| port.parse::<u16>().is_ok())
        .map_or(cfg.peers_dns.as_str(), |(name, _)| name);
    [cfg.name.as_str(), cfg.consul_service.as_str(), dns]
        .into_iter()
        .map(str::trim)
        .find(|n| !n.is_empty())
        .unwrap_or("fleet")
        .to_string()
}

/// What this agent sends for the fleet: a trigger or a resolve of one condition's incident.
#[derive(Debug, Clone, PartialEq)]
pub struct Send {
    pub kind: Kind,
    pub condition: Condition,
    pub incident: u64,
    pub opened_at: SystemTime,
    pub tag: FleetTag,
}

impl Send {
    /// The transition an [`Event`] is made of.
    pub fn transition(&self) -> Transition {
        Transition {
            kind: self.kind,
            condition: self.condition,
            scope: super::incident::Scope::Fleet,
            incident: self.incident,
            opened_at: self.opened_at,
        }
    }
}

/// The latest word of one agent holding the incident.
#[derive(Debug, Clone, Copy)]
struct Heard {
    at: Instant,
    /// It said it queued the trigger and is delivering it.
    pending: bool,
}

/// One fleet incident as this agent follows it.
#[derive(Debug)]
struct Shared {
    condition: Condition,
    /// This agent's number for it (its own incident's, when it joined).
    incident: u64,
    opened_at: SystemTime,
    joined: Instant,
    /// This agent's own incident is open; else it is the reporter waiting for the others.
    local: bool,
    /// The other agents known to hold it open, by instance id.
    holders: HashMap<String, Heard>,
    /// When each peer last answered without it: word of it from before then is out of date.
    released: HashMap<String, Instant>,
    /// The trigger went out (here, or heard from a peer).
    sent: bool,
    /// This agent queued the trigger; the event lives until every destination is done with it.
    queued: Option<Weak<Event>>,
    /// The most agents known to hold it at once, this one included.
    peak: usize,
}

impl Shared {
    fn new(t: &Transition, now: Instant) -> Self {
        Self {
            condition: t.condition,
            incident: t.incident,
            opened_at: t.opened_at,
            joined: now,
            local: true,
            holders: HashMap::new(),
            released: HashMap::new(),
            sent: false,
            queued: None,
            peak: 1,
        }
    }

    /// Takes one word that `id` holds it, heard at `at`; `pending` only from its own view.
    fn hold(&mut self, id: &str, at: Instant, pending: Option<bool>) {
        if self.released.get(id).is_some_and(|r| *r >= at) {
            return;
        }
        let h = self
            .holders
            .entry(id.to_string())
            .or_insert(Heard { at, pending: false });
        if at >= h.at {
            h.at = at;
            if let Some(p) = pending {
                h.pending = p;
            }
        }
    }

    /// Takes in what the peers that answered the latest round said (from after this agent
    /// joined: older word may be of an incident that has ended since).
    fn hear(&mut self, me: &str, peers: &[PeerAlerts]) {
        let (key, joined) = (self.condition.key(), self.joined);
        for p in peers
            .iter()
            .filter(|p| p.instance != me && p.heard >= joined)
        {
            match p.alerts.iter().find(|a| a.condition == key) {
                Some(claim) => {
                    let pending = claim.trigger == TriggerState::Pending;
                    self.hold(&p.instance, p.heard, Some(pending));
                    self.sent |= claim.trigger == TriggerState::Sent;
                    let named = claim.reporter.as_str();
                    if !named.is_empty() && named != me && named != p.instance {
                        let at = p
                            .heard
                            .checked_sub(Duration::from_millis(claim.reporter_ms))
                            .unwrap_or(p.heard);
                        self.hold(named, at, None);
                    }
                }
                None => {
                    let r = self.released.entry(p.instance.clone()).or_insert(p.heard);
                    *r = (*r).max(p.heard);
                    if self
                        .holders
                        .get(&p.instance)
                        .is_some_and(|h| h.at <= p.heard)
                    {
                        self.holders.remove(&p.instance);
                    }
                }
            }
        }
    }

    /// The reporter: the lowest id of this agent and the holders (the caller expired the
    /// old ones), and when it was last heard.
    fn reporter<'a>(&'a self, me: &'a str, now: Instant) -> (&'a str, Instant) {
        self.holders
            .iter()
            .map(|(id, h)| (id.as_str(), h.at))
            .chain([(me, now)])
            .min_by(|a, b| a.0.cmp(b.0))
            .unwrap_or((me, now))
    }

    fn trigger_state(&self) -> TriggerState {
        if self.sent {
            TriggerState::Sent
        } else if self.queued.is_some() {
            TriggerState::Pending
        } else {
            TriggerState::None
        }
    }
}

/// The fleet's incidents this agent follows, and what it tells its peers of them.
pub struct Fleet {
    name: Arc<str>,
    me: String,
    settle: Duration,
    lease: Duration,
    witness: Witness,
    shared: Vec<Shared>,
}

impl Fleet {
    /// `settle`: two rounds of asking and a peer's timeout, so a round that began after this
    /// agent joined has come back. `lease`: as long as a round stays evidence for the verdicts.
    pub fn new(cfg: &FleetConfig, me: &str, witness: Witness) -> Self {
        let round = cfg.interval.saturating_add(cfg.timeout);
        Self::tuned(
            name(cfg),
            me,
            cfg.interval.saturating_mul(2).saturating_add(cfg.timeout),
            round.saturating_mul(3),
            witness,
        )
    }

    pub fn tuned(name: String, me: &str, settle: Duration, lease: Duration, w: Witness) -> Self {
        Self {
            name: name.into(),
            me: me.to_string(),
            settle,
            lease,
            witness: w,
            shared: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn find(&mut self, c: Condition) -> Option<&mut Shared> {
        self.shared.iter_mut().find(|s| s.condition == c)
    }

    /// This agent's own incident of fleet scope opened or resolved.
    pub fn local(&mut self, t: &Transition, now: Instant) {
        let me = self.me.clone();
        match (t.kind, self.find(t.condition)) {
            (Kind::Trigger, Some(s)) => s.local = true,
            (Kind::Trigger, None) => self.shared.push(Shared::new(t, now)),
            (Kind::Resolve, Some(s)) => {
                s.local = false;
                // Not the reporter: the reporter resolves it for everyone.
                if s.reporter(&me, now).0 != me {
                    self.shared.retain(|s| s.condition != t.condition);
                }
            }
            (Kind::Resolve, None) => {}
        }
    }

    /// One snapshot's round of the peers' word: what this agent must send now.
    pub fn step(&mut self, peers: &[PeerAlerts], now: Instant) -> Vec<Send> {
        let mut out = Vec::new();
        let (me, settle, lease) = (self.me.clone(), self.settle, self.lease);
        for s in &mut self.shared {
            s.hear(&me, peers);
            s.holders
                .retain(|_, h| now.saturating_duration_since(h.at) < lease);
            if s.queued.as_ref().is_some_and(|q| q.strong_count() == 0) {
                s.queued = None;
                s.sent = true;
            }
            s.peak = s.peak.max(s.holders.len() + 1);
            let reporting = s.reporter(&me, now).0 == me;
            let tag = |n| FleetTag {
                name: self.name.clone(),
                instances: n,
            };
            let send = |kind, n| Send {
                kind,
                condition: s.condition,
                incident: s.incident,
                opened_at: s.opened_at,
                tag: tag(n),
            };
            if s.local {
                let delivering = s.holders.values().any(|h| h.pending);
                let due = now.saturating_duration_since(s.joined) >= settle;
                if reporting && due && !s.sent && s.queued.is_none() && !delivering {
                    out.push(send(Kind::Trigger, s.holders.len() + 1));
                }
            } else if reporting && s.holders.is_empty() {
                // The last one holding it, and the reporter: the one resolve.
                if s.sent || s.queued.is_some() {
                    out.push(send(Kind::Resolve, s.peak));
                }
            }
        }
        let closed: Vec<Condition> = out
            .iter()
            .filter(|o| o.kind == Kind::Resolve)
            .map(|o| o.condition)
            .collect();
        let reporter_of = |s: &Shared| s.reporter(&me, now).0 == me;
        self.shared
            .retain(|s| !closed.contains(&s.condition) && (s.local || reporter_of(s)));
        out
    }

    /// The trigger of `condition` was queued as `ev`: it is pending until every destination
    /// has let go of it.
    pub fn queued(&mut self, condition: Condition, ev: &Arc<Event>) {
        if let Some(s) = self.find(condition) {
            s.queued = Some(Arc::downgrade(ev));
        }
    }

    /// What the peer view shows from now on.
    pub fn publish(&self, now: Instant) {
        let claims = self
            .shared
            .iter()
            .map(|s| {
                let (reporter, heard) = s.reporter(&self.me, now);
                HeldClaim {
                    condition: s.condition.key(),
                    reporter: reporter.to_string(),
                    reporter_heard: heard,
                    trigger: s.trigger_state(),
                }
            })
            .collect();
        self.witness.set_alerts(claims);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::{incident::Scope, tests::event};

    const S: Duration = Duration::from_secs(1);
    const INFRA: Condition = Condition::InfrastructureIssue;

    /// One agent of a simulated fleet: its fleet state, its view's claims, what it sent.
    struct Sim {
        id: &'static str,
        fleet: Fleet,
        witness: Witness,
        alive: bool,
        /// Triggers being delivered (dropped: delivered).
        delivering: Vec<Arc<Event>>,
        sent: Vec<Send>,
        next: u64,
    }

    impl Sim {
        fn new(id: &'static str) -> Self {
            let witness = Witness::default();
            Self {
                id,
                // settle 3 s, lease 6 s: `fleet.interval` and `timeout` of 1 s.
                fleet: Fleet::tuned("shop".into(), id, 3 * S, 6 * S, witness.clone()),
                witness,
                alive: true,
                delivering: Vec::new(),
                sent: Vec::new(),
                next: 1,
            }
        }

        fn local(&mut self, kind: Kind, now: Instant) {
            let t = Transition {
                kind,
                condition: INFRA,
                scope: Scope::Fleet,
                incident: self.next,
                opened_at: SystemTime::now(),
            };
            self.next += 1;
            self.fleet.local(&t, now);
        }

        fn count(&self, kind: Kind) -> usize {
            self.sent.iter().filter(|s| s.kind == kind).count()
        }
    }

    /// A fleet whose agents hear each other every second (a round), `t` seconds from `t0`.
    struct World {
        t0: Instant,
        agents: Vec<Sim>,
        /// Deliveries take this long (a slow receiver); zero: at once.
        slow: bool,
    }

    impl World {
        fn new(ids: &[&'static str]) -> Self {
            Self {
                t0: Instant::now(),
                agents: ids.iter().map(|id| Sim::new(id)).collect(),
                slow: false,
            }
        }

        fn at(&self, secs: u64) -> Instant {
            self.t0 + Duration::from_secs(secs)
        }

        fn local(&mut self, i: usize, kind: Kind, secs: u64) {
            let now = self.at(secs);
            self.agents[i].local(kind, now);
        }

        /// What every live agent's view says at `secs`.
        fn views(&self, secs: u64) -> Vec<PeerAlerts> {
            let now = self.at(secs);
            self.agents
                .iter()
                .filter(|a| a.alive)
                .map(|a| PeerAlerts {
                    instance: a.id.to_string(),
                    heard: now,
                    alerts: a.witness.alerts(now),
                })
                .collect()
        }

        /// One round at `secs`: every live agent hears the others' views, steps and publishes.
        fn round(&mut self, secs: u64) {
            let now = self.at(secs);
            let views = self.views(secs);
            let slow = self.slow;
            for a in self.agents.iter_mut().filter(|a| a.alive) {
                if !slow {
                    a.delivering.clear();
                }
                for s in a.fleet.step(&views, now) {
                    if s.kind == Kind::Trigger {
                        let ev = event(Kind::Trigger, s.incident);
                        a.fleet.queued(s.condition, &ev);
                        a.delivering.push(ev);
                    }
                    a.sent.push(s);
                }
                a.fleet.publish(now);
            }
        }

        fn rounds(&mut self, from: u64, to: u64) {
            for t in from..=to {
                self.round(t);
            }
        }

        fn total(&self, kind: Kind) -> usize {
            self.agents.iter().map(|a| a.count(kind)).sum()
        }

        fn senders(&self, kind: Kind) -> Vec<&'static str> {
            self.agents
                .iter()
                .filter(|a| a.count(kind) > 0)
                .map(|a| a.id)
                .collect()
        }
    }

    #[test]
    fn a_shared_fault_is_one_trigger_and_one_resolve_from_the_lowest_id() {
        let mut w = World::new(&["b", "a", "c"]);
        // They see it within two seconds of each other, the lowest id last.
        w.local(0, Kind::Trigger, 0);
        w.local(2, Kind::Trigger, 1);
        w.round(1);
        w.local(1, Kind::Trigger, 2);
        w.rounds(2, 20);
        assert_eq!(w.total(Kind::Trigger), 1, "{:?}", w.senders(Kind::Trigger));
        assert_eq!(w.senders(Kind::Trigger), ["a"]);
        let t = &w.agents[1].sent[0];
        assert_eq!(t.tag.instances, 3);
        assert_eq!(&*t.tag.name, "shop");
        // It clears: the reporter first, the others a little later; one resolve, once nobody
        // holds it.
        w.local(1, Kind::Resolve, 21);
        w.rounds(21, 23);
        assert_eq!(w.total(Kind::Resolve), 0, "the others still hold it");
        w.local(0, Kind::Resolve, 24);
        w.local(2, Kind::Resolve, 24);
        w.rounds(24, 40);
        assert_eq!(w.senders(Kind::Resolve), ["a"]);
        assert_eq!(w.total(Kind::Resolve), 1);
        assert_eq!(w.agents[1].sent[1].tag.instances, 3, "the most at once");
        assert!(w
            .agents
            .iter()
            .all(|a| a.witness.alerts(w.at(40)).is_empty()));
    }

    #[test]
    fn a_late_lower_id_takes_the_resolve_not_the_trigger() {
        let mut w = World::new(&["b", "c", "a"]);
        w.local(0, Kind::Trigger, 0);
        w.local(1, Kind::Trigger, 0);
        w.rounds(0, 8);
        assert_eq!(w.senders(Kind::Trigger), ["b"]);
        w.local(2, Kind::Trigger, 9);
        w.rounds(9, 20);
        assert_eq!(w.total(Kind::Trigger), 1, "the trigger went out already");
        for i in 0..3 {
            w.local(i, Kind::Resolve, 21);
        }
        w.rounds(21, 30);
        assert_eq!(w.senders(Kind::Resolve), ["a"]);
        assert_eq!(w.total(Kind::Resolve), 1);
    }

    #[test]
    fn the_reporter_killed_mid_incident_leaves_the_resolve_to_the_next() {
        let mut w = World::new(&["a", "b", "c"]);
        for i in 0..3 {
            w.local(i, Kind::Trigger, 0);
        }
        w.rounds(0, 8);
        assert_eq!(w.senders(Kind::Trigger), ["a"]);
        w.agents[0].alive = false;
        w.rounds(9, 20);
        assert_eq!(w.total(Kind::Trigger), 1, "b knows the trigger went out");
        w.local(1, Kind::Resolve, 21);
        w.local(2, Kind::Resolve, 21);
        w.rounds(21, 30);
        assert_eq!(w.senders(Kind::Resolve), ["b"]);
        assert_eq!(w.total(Kind::Resolve), 1);
    }

    #[test]
    fn a_reporter_killed_before_its_trigger_went_out_is_replaced_within_the_lease() {
        let mut w = World::new(&["a", "b", "c"]);
        w.slow = true;
        for i in 0..3 {
            w.local(i, Kind::Trigger, 0);
        }
        w.rounds(0, 5);
        assert_eq!(w.senders(Kind::Trigger), ["a"]);
        // Still delivering, a peer sees it pending and waits.
        w.rounds(6, 8);
        assert_eq!(w.total(Kind::Trigger), 1);
        // Last heard at 8 s; the lease is 6 s.
        w.agents[0].alive = false;
        w.rounds(9, 13);
        assert_eq!(
            w.total(Kind::Trigger),
            1,
            "within the lease, b still waits for a"
        );
        w.rounds(14, 17);
        assert_eq!(w.senders(Kind::Trigger), ["a", "b"], "b took over");
        assert_eq!(w.total(Kind::Trigger), 2);
    }

    #[test]
    fn an_ended_incidents_word_does_not_silence_the_next() {
        let mut w = World::new(&["a", "b"]);
        w.local(0, Kind::Trigger, 0);
        w.local(1, Kind::Trigger, 0);
        w.rounds(0, 5);
        let old = w.views(5);
        w.local(1, Kind::Resolve, 6);
        w.local(0, Kind::Resolve, 6);
        w.rounds(6, 8);
        assert_eq!((w.total(Kind::Trigger), w.total(Kind::Resolve)), (1, 1));
        // It recurs on b while b's latest round is still one from the first incident.
        w.local(1, Kind::Trigger, 10);
        let b = &mut w.agents[1];
        assert!(b.fleet.step(&old, w.t0 + 10 * S).is_empty());
        b.fleet.publish(w.t0 + 10 * S);
        assert_eq!(
            b.witness.alerts(w.t0 + 10 * S)[0].trigger,
            TriggerState::None
        );
        w.rounds(11, 16);
        assert_eq!(
            w.agents[1].count(Kind::Trigger),
            1,
            "the second incident's trigger"
        );
    }

    #[test]
    fn names_fall_back_to_the_peers_source() {
        let cfg = |toml: &str| crate::config::Config::parse(toml, "x").unwrap().fleet;
        assert_eq!(name(&cfg("[fleet]\npeers = [\"a:1\"]\n")), "fleet");
        assert_eq!(
            name(&cfg("[fleet]\npeers_dns = \"web.internal:8080\"\n")),
            "web.internal"
        );
        assert_eq!(
            name(&cfg(
                "[fleet]\nconsul_addr = \"http://127.0.0.1:8500\"\nconsul_service = \"shop\"\n"
            )),
            "shop"
        );
        assert_eq!(
            name(&cfg("[fleet]\nname = \"shop-eu\"\npeers_dns = \"web\"\n")),
            "shop-eu"
        );
    }
}
