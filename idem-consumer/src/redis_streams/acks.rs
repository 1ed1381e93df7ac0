//! Acks, sent together: one `XACK` carries every ack queued while the one before it
//! was on its way.

use redis::Client;
use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};

use super::settling;

/// An ack waiting for its `XACK`, and where its answer goes.
pub(super) struct PendingAck {
    pub(super) entry_id: String,
    pub(super) answer: oneshot::Sender<redis::RedisResult<()>>,
}

/// Most entry ids in one `XACK`.
const ACK_BATCH: usize = 1024;

/// Sends the acks of a source's deliveries: each `XACK` carries every ack queued while
/// the one before it was on its way, and each ack gets its batch's answer. A failed
/// `XACK` fails its batch (those entries stay pending, to be delivered again) and the
/// next batch goes out on a new connection. Ends once the source and all its deliveries
/// are gone.
pub(super) async fn acker(
    stream: String,
    group: String,
    client: Client,
    mut conn: Option<MultiplexedConnection>,
    mut queue: mpsc::UnboundedReceiver<PendingAck>,
) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, ACK_BATCH).await > 0 {
        let mut xack = redis::cmd("XACK");
        xack.arg(&stream).arg(&group);
        for a in &batch {
            xack.arg(&a.entry_id);
        }
        let sent = match conn.as_mut() {
            Some(c) => xack.query_async::<i64>(c).await,
            None => match client
                .get_multiplexed_async_connection_with_config(&settling())
                .await
            {
                Ok(mut c) => {
                    let sent = xack.query_async::<i64>(&mut c).await;
                    conn = Some(c);
                    sent
                }
                Err(e) => Err(e),
            },
        };
        let sent = sent.map(drop);
        if sent.is_err() {
            conn = None;
        }
        for a in batch.drain(..) {
            let _ = a.answer.send(sent.clone());
        }
    }
}
