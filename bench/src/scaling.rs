//! Throughput from 1 to 256 concurrent tasks, for idem and the peers,
//! in memory and (with `--redis`) on Redis. The series feed the chart.

use std::sync::Arc;
use std::time::Duration;

use crate::args::Args;
use crate::load::{self, Ctx, Plan};
use crate::peers::{self, REPLAY_BASE};
use crate::report::{Report, Series, fmt_rate, markdown_table};
use crate::work::{BenchError, receipt};

const TASKS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

async fn series<F, Fut>(args: &Args, name: &str, op: F) -> Series
where
    F: Fn(Ctx) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let (warmup, duration) = if args.quick {
        (Duration::from_millis(50), Duration::from_millis(150))
    } else {
        (Duration::from_millis(150), Duration::from_millis(700))
    };
    let mut points = Vec::new();
    for tasks in TASKS {
        let o = load::run(Plan::new(tasks, warmup, duration), op.clone()).await;
        let ops = if o.errors > 0 { 0.0 } else { o.ops_per_sec() };
        eprintln!("  {name:<44} {tasks:>4} tasks {:>10} ops/s", fmt_rate(ops));
        points.push((tasks, ops));
    }
    Series {
        name: name.to_owned(),
        points,
    }
}

pub(crate) async fn run(args: &Args, report: &mut Report) {
    peers::init_memory();
    let mut all = vec![
        series(args, "idem replay, memory", |c: Ctx| async move {
            peers::idem_charge(REPLAY_BASE + c.task as u64)
                .await
                .map(drop)
        })
        .await,
        series(args, "cached #[cached] hit, memory", |c: Ctx| async move {
            peers::cached_charge(REPLAY_BASE + c.task as u64)
                .await
                .map(drop)
        })
        .await,
        series(
            args,
            "cached #[concurrent_cached] hit, memory",
            |c: Ctx| async move {
                peers::ccached_charge(REPLAY_BASE + c.task as u64)
                    .await
                    .map(drop)
            },
        )
        .await,
        series(args, "idem new key, memory", |c: Ctx| async move {
            peers::idem_charge(c.id).await.map(drop)
        })
        .await,
    ];
    if let Some(url) = &args.redis {
        peers::set_redis_url(url);
        match peers::redis_store(url) {
            Ok((store, idem)) => {
                let i = idem.clone();
                all.push(
                    series(args, "idem replay, Redis", move |c: Ctx| {
                        let i = i.clone();
                        async move {
                            let k = REPLAY_BASE + c.task as u64;
                            i.dedup(
                                &peers::DEDUP,
                                k,
                                async move { Ok::<_, BenchError>(receipt(k)) },
                            )
                            .await
                            .map(drop)
                        }
                    })
                    .await,
                );
                all.push(
                    series(
                        args,
                        "cached AsyncRedisCache hit, Redis",
                        |c: Ctx| async move {
                            peers::cached_redis_charge(REPLAY_BASE + c.task as u64)
                                .await
                                .map(drop)
                        },
                    )
                    .await,
                );
                let i = idem.clone();
                all.push(
                    series(args, "idem new key, Redis", move |c: Ctx| {
                        let i = i.clone();
                        async move {
                            i.dedup(&peers::DEDUP, c.id, async move {
                                Ok::<_, BenchError>(receipt(c.id))
                            })
                            .await
                            .map(drop)
                        }
                    })
                    .await,
                );
                let (s, p): (_, Arc<str>) = (store.clone(), Arc::from(peers::redis_prefix()));
                all.push(
                    series(
                        args,
                        "hand-written SET NX PX + GET new key, Redis",
                        move |c: Ctx| {
                            let (s, key) = (s.clone(), format!("{p}hand:{}", c.id));
                            async move {
                                peers::handwritten(&s, &key, Duration::from_secs(30), async move {
                                    Ok(receipt(c.id))
                                })
                                .await
                                .map(drop)
                            }
                        },
                    )
                    .await,
                );
                crate::work::redis_cleanup(&store, &peers::redis_prefix()).await;
            }
            Err(e) => report.note(format!("redis scaling skipped: {e}")),
        }
    }
    let mut rows = vec![
        std::iter::once("ops/s at N tasks".to_owned())
            .chain(TASKS.iter().map(|t| t.to_string()))
            .collect::<Vec<_>>(),
    ];
    for s in &all {
        rows.push(
            std::iter::once(s.name.clone())
                .chain(s.points.iter().map(|p| fmt_rate(p.1)))
                .collect(),
        );
    }
    let mut right = vec![false];
    right.extend(TASKS.iter().map(|_| true));
    report.section(
        "Scaling: ops/s from 1 to 256 tasks",
        markdown_table(&rows, &right),
    );
    report.series = all;
}
