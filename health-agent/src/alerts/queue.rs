//! The bounded queue between `Alerts::observe` (the composer, which must never wait) and one
//! destination's sender task. Pushing never blocks or awaits: a std mutex held for a few
//! pointer moves, then a `Notify` permit.
//!
//! When the queue is full (the receiver is dead or slow), the rule is:
//! 1. evict the oldest queued *trigger*, together with its resolve if that is queued too (the
//!    receiver never heard of the incident, so a lone "resolved" would be noise);
//! 2. a *resolve* is always accepted, even above capacity, because its trigger may already
//!    have been sent and an incident must not stay open at the receiver forever. This stays
//!    bounded: a trigger is taken by the sender only after every earlier message, so at any
//!    moment at most one queued resolve per condition belongs to a sent trigger — everything
//!    else is evictable;
//! 3. a trigger that finds nothing to evict is dropped.
//!
//! Order is FIFO, so per destination a resolve never overtakes its trigger.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::incident::{Event, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// Queued after evicting an older (unsent) incident's trigger.
    Evicted {
        incident: u64,
    },
    /// The queue was full of messages that must stay: this trigger was dropped.
    Dropped,
}

pub struct Queue {
    items: Mutex<VecDeque<Arc<Event>>>,
    capacity: usize,
    notify: Notify,
}

impl Queue {
    pub fn new(capacity: usize) -> Self {
        Self {
            items: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity: capacity.max(1),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Event>>> {
        // A panic while holding the lock leaves a consistent deque; keep going.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, ev: Arc<Event>) -> Pushed {
        let outcome = {
            let mut items = self.lock();
            let mut outcome = Pushed::Queued;
            if items.len() >= self.capacity {
                match items.iter().position(|e| e.kind == Kind::Trigger) {
                    Some(i) => {
                        let incident = items[i].incident;
                        items.retain(|e| e.incident != incident);
                        outcome = Pushed::Evicted { incident };
                    }
                    None if ev.kind == Kind::Trigger => return Pushed::Dropped,
                    None => {}
                }
            }
            items.push_back(ev);
            outcome
        };
        self.notify.notify_one();
        outcome
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn pop(&self) -> Option<Arc<Event>> {
        self.lock().pop_front()
    }

    /// The next message; `None` once shutdown has begun and the queue is empty.
    pub async fn next(&self, shutdown: &CancellationToken) -> Option<Arc<Event>> {
        loop {
            if let Some(ev) = self.pop() {
                return Some(ev);
            }
            if shutdown.is_cancelled() {
                return None;
            }
            // notify_one leaves a permit when nobody waits, so a push between the pop above
            // and this await is not lost.
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::tests::event;

    fn kinds(q: &Queue) -> Vec<(Kind, u64)> {
        q.lock().iter().map(|e| (e.kind, e.incident)).collect()
    }

    #[test]
    fn full_queue_evicts_the_oldest_unsent_incident() {
        let q = Queue::new(3);
        assert_eq!(q.push(event(Kind::Trigger, 1)), Pushed::Queued);
        assert_eq!(q.push(event(Kind::Resolve, 1)), Pushed::Queued);
        assert_eq!(q.push(event(Kind::Trigger, 2)), Pushed::Queued);
        assert_eq!(
            q.push(event(Kind::Trigger, 3)),
            Pushed::Evicted { incident: 1 }
        );
        assert_eq!(kinds(&q), vec![(Kind::Trigger, 2), (Kind::Trigger, 3)]);
    }

    #[test]
    fn resolve_of_a_sent_trigger_is_never_dropped() {
        let q = Queue::new(2);
        q.push(event(Kind::Trigger, 1));
        // The sender took trigger 1: it is out there now.
        assert_eq!(q.pop().map(|e| e.incident), Some(1));
        q.push(event(Kind::Resolve, 1));
        q.push(event(Kind::Resolve, 7));
        // Full of resolves: another resolve still gets in, a trigger does not.
        assert_eq!(q.push(event(Kind::Resolve, 8)), Pushed::Queued);
        assert_eq!(q.push(event(Kind::Trigger, 9)), Pushed::Dropped);
        assert_eq!(
            kinds(&q),
            vec![(Kind::Resolve, 1), (Kind::Resolve, 7), (Kind::Resolve, 8)]
        );
    }

    #[tokio::test]
    async fn messages_leave_in_the_order_they_came() {
        let q = Queue::new(8);
        let stop = CancellationToken::new();
        for (k, i) in [(Kind::Trigger, 1), (Kind::Trigger, 2), (Kind::Resolve, 1)] {
            q.push(event(k, i));
        }
        let mut out = Vec::new();
        while let Some(e) = q.pop() {
            out.push((e.kind, e.incident));
        }
        assert_eq!(
            out,
            vec![(Kind::Trigger, 1), (Kind::Trigger, 2), (Kind::Resolve, 1)]
        );
        assert!(q.is_empty());
        q.push(event(Kind::Trigger, 3));
        q.push(event(Kind::Resolve, 3));
        stop.cancel();
        // After shutdown what is queued still comes out, in order, then None.
        assert_eq!(q.next(&stop).await.map(|e| e.kind), Some(Kind::Trigger));
        assert_eq!(q.next(&stop).await.map(|e| e.kind), Some(Kind::Resolve));
        assert!(q.next(&stop).await.is_none());
    }

    #[tokio::test]
    async fn next_waits_for_a_push_and_ends_on_shutdown() {
        let q = Arc::new(Queue::new(4));
        let stop = CancellationToken::new();
        let (q2, s2) = (q.clone(), stop.clone());
        let waiter = tokio::spawn(async move { q2.next(&s2).await.map(|e| e.incident) });
        tokio::task::yield_now().await;
        q.push(event(Kind::Trigger, 5));
        assert_eq!(waiter.await.unwrap(), Some(5));
        stop.cancel();
        assert!(q.next(&stop).await.is_none());
    }
}
