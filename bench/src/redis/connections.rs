//! Connection use, measured on raw `SET NX PX`: a deadpool checkout per command, one
//! shared multiplexed connection, and `RedisStore`'s round-robin over N multiplexed
//! connections. This is the evidence for the store's design (see its `connect.rs`).

use idem_runtime::RedisStore;
use idem_runtime::store::redis::{deadpool_redis, redis};

use super::baseline::{key, set_nx};
use super::ctx::Ctx;
use crate::runner::run;
use crate::stats::Row;

pub(crate) async fn all(ctx: &Ctx, tasks: usize) -> Vec<Row> {
    let mut rows = Vec::new();

    let pool = deadpool_redis::Config::from_url(ctx.url.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("deadpool");
    let run_id = ctx.run.clone();
    rows.push(
        run(
            "connections",
            "deadpool checkout per command",
            tasks,
            ctx.secs,
            move |t, i| {
                let (pool, run_id) = (pool.clone(), run_id.clone());
                async move {
                    let mut c = pool.get().await.map_err(|e| e.to_string())?;
                    let _: Option<String> = set_nx(key(&run_id, t, i))
                        .query_async(&mut *c)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
            },
        )
        .await,
    );

    let conn = redis::Client::open(ctx.url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let run_id = ctx.run.clone();
    rows.push(
        run(
            "connections",
            "one shared multiplexed",
            tasks,
            ctx.secs,
            move |t, i| {
                let (mut conn, run_id) = (conn.clone(), run_id.clone());
                async move {
                    let _: Option<String> = set_nx(key(&run_id, t, i))
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
            },
        )
        .await,
    );

    for n in [1usize, 2, 4, 8] {
        let store = RedisStore::builder()
            .connections(n)
            .connect(&ctx.url)
            .expect("store");
        let run_id = ctx.run.clone();
        rows.push(
            run(
                "connections",
                format!("RedisStore, {n} multiplexed r-r"),
                tasks,
                ctx.secs,
                move |t, i| {
                    let (store, run_id) = (store.clone(), run_id.clone());
                    async move {
                        let _: Option<String> = store
                            .command(&set_nx(key(&run_id, t, i)))
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok(())
                    }
                },
            )
            .await,
        );
    }
    rows
}
