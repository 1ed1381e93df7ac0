//! Waking waiters: one pub/sub connection per store, dispatching to in-process waiters.
//!
//! Every store of one prefix publishes on one channel (`{prefix}notify`), and the message
//! is the record's key. One channel rather than one per key because a waiter then needs
//! no `SUBSCRIBE` round trip: the channel is subscribed once, before the first waiter is
//! registered, so a notification can never slip between "subscribe" and "wait". Scripts
//! publish only when a `Busy` reply had set the record's `w` flag, so an uncontended
//! call publishes nothing, and every process only hears about keys somebody waited on.
//!
//! While the subscriber connection is down, `subscribe` answers
//! [`Subscription::never`], and the strategies poll with backoff; when it drops, every
//! waiter is woken (a spurious wake-up is allowed, a lost one is not). A keep-alive
//! `PING` notices a connection that hangs without closing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{oneshot, watch};

use crate::store::Subscription;

/// How often the subscriber connection is checked with a `PING`.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// A live subscription still fires after this long, in case a message was lost on a
/// connection that failed silently; the caller then claims again (a spurious wake-up).
const SAFETY_NET: Duration = Duration::from_secs(2);

pub(crate) struct Notifier {
    /// Servers to subscribe on, tried in turn (any node of a cluster hears every
    /// `PUBLISH`). Empty: no pub/sub, callers poll.
    clients: Vec<redis::Client>,
    channel: String,
    timeout: Duration,
    state: Mutex<State>,
    /// `true` while the subscription is live.
    up: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    waiters: HashMap<Vec<u8>, Vec<(u64, oneshot::Sender<()>)>>,
    task: Option<tokio::task::AbortHandle>,
}

impl Notifier {
    pub(crate) fn new(clients: Vec<redis::Client>, channel: String, timeout: Duration) -> Self {
        Notifier {
            clients,
            channel,
            timeout,
            state: Mutex::new(State::default()),
            up: watch::Sender::new(false),
        }
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// A subscription to changes of the record named `record`.
    pub(crate) async fn subscribe(self: &Arc<Self>, record: &str) -> Subscription {
        if self.clients.is_empty() {
            return Subscription::never();
        }
        self.start();
        let mut up = self.up.subscribe();
        // Only the first waiter (or one during an outage) waits for the connection.
        if !*up.borrow_and_update() {
            let _ = tokio::time::timeout(self.timeout, up.wait_for(|u| *u)).await;
        }
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = lock(&self.state);
            // Checked under the lock that `drop_all` takes, so a waiter registered here
            // is either woken by a later outage or served by a live subscription.
            if !*self.up.borrow() {
                return Subscription::never();
            }
            st.next_id += 1;
            let id = st.next_id;
            st.waiters
                .entry(record.as_bytes().to_vec())
                .or_default()
                .push((id, tx));
            id
        };
        let guard = WaiterGuard {
            notifier: Arc::downgrade(self),
            record: record.as_bytes().to_vec(),
            id,
        };
        Subscription::new(async move {
            let _guard = guard;
            tokio::select! {
                _ = rx => {}
                _ = tokio::time::sleep(SAFETY_NET) => {}
            }
        })
    }

    fn start(self: &Arc<Self>) {
        let mut st = lock(&self.state);
        // Restarted if it ended with the runtime that spawned it (a store outliving a
        // test's runtime, say).
        if st.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.up.send_replace(false);
        let me = Arc::downgrade(self);
        let handle = tokio::spawn(run(me));
        st.task = Some(handle.abort_handle());
    }

    fn wake(&self, record: &[u8]) {
        let ws = lock(&self.state).waiters.remove(record);
        for (_, tx) in ws.into_iter().flatten() {
            let _ = tx.send(());
        }
    }

    fn set_up(&self, up: bool) {
        let all = {
            let mut st = lock(&self.state);
            self.up.send_replace(up);
            if up {
                return;
            }
            std::mem::take(&mut st.waiters)
        };
        for (_, tx) in all.into_values().flatten() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.state).task.take() {
            t.abort();
        }
    }
}

/// Unregisters a waiter whose subscription was dropped without firing.
struct WaiterGuard {
    notifier: Weak<Notifier>,
    record: Vec<u8>,
    id: u64,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let Some(n) = self.notifier.upgrade() else {
            return;
        };
        let mut st = lock(&n.state);
        if let Some(ws) = st.waiters.get_mut(&self.record) {
            ws.retain(|(id, _)| *id != self.id);
            if ws.is_empty() {
                st.waiters.remove(&self.record);
            }
        }
    }
}

/// The subscriber task: (re)connects, forwards messages, marks outages. Holds the
/// notifier weakly so it ends with the store.
async fn run(me: Weak<Notifier>) {
    let mut attempt = 0usize;
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(n) = me.upgrade() else { return };
        let client = n.clients[attempt % n.clients.len()].clone();
        let (channel, timeout) = (n.channel.clone(), n.timeout);
        drop(n);
        attempt += 1;
        let connected = tokio::time::timeout(timeout, async {
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(ps)
        })
        .await;
        let ps = match connected {
            Ok(Ok(ps)) => ps,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "idem: redis pub/sub connect failed; waiters poll");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(_) => {
                tracing::debug!("idem: redis pub/sub connect timed out; waiters poll");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let Some(n) = me.upgrade() else { return };
        n.set_up(true);
        drop(n);
        let (mut sink, mut stream) = ps.split();
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.tick().await;
        loop {
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { break };
                    let Some(n) = me.upgrade() else { return };
                    n.wake(msg.get_payload_bytes());
                }
                _ = keepalive.tick() => {
                    match tokio::time::timeout(timeout, sink.ping::<String>()).await {
                        Ok(Ok(_)) => {}
                        _ => break,
                    }
                }
            }
        }
        tracing::debug!("idem: redis pub/sub connection lost; reconnecting");
        let Some(n) = me.upgrade() else { return };
        n.set_up(false);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding this lock; recover rather than propagate poison.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
