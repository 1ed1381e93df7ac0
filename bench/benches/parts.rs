//! Where a replay's time goes: each piece of idem's hot path on its own.
//!
//! `cargo bench -p idem-bench --bench parts`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use idem_runtime::codec::ReplayOk;
use idem_runtime::store::{ClaimKind, ClaimRequest, Owner};
use idem_runtime::{Codec, Error, Idem, Key, MemoryStore, Options, Store};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
    cents: u64,
    status: String,
}

static OPTS: Options = Options::dedup("bench::parts");

fn parts(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ns = "bench";
    let order_id = 42u64;
    let mut g = c.benchmark_group("parts");
    g.bench_function("key-digest", |b| {
        b.iter(|| {
            Key::new(
                ns,
                "bench::parts",
                format_args!("order:{}", black_box(order_id)),
            )
        })
    });
    let key = Key::new(ns, "bench::parts", format_args!("order:{order_id}"));
    let value = Receipt {
        order_id,
        cents: 4200,
        status: "paid".into(),
    };
    let bytes = <ReplayOk as Codec<Receipt, Error>>::encode(&key, &Ok(value.clone()))
        .expect("encode")
        .expect("bytes");
    g.bench_function("decode", |b| {
        b.iter(|| <ReplayOk as Codec<Receipt, Error>>::decode(&key, black_box(&bytes)))
    });
    g.bench_function("encode", |b| {
        b.iter(|| <ReplayOk as Codec<Receipt, Error>>::encode(&key, black_box(&Ok(value.clone()))))
    });
    let store = MemoryStore::new();
    rt.block_on(async {
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(30));
        store.claim(&key, &req).await.expect("claim");
        store
            .complete(&key, req.owner, bytes.clone(), Duration::from_secs(3600))
            .await
            .expect("complete");
    });
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(30));
    g.bench_function("store-claim-replay", |b| {
        b.to_async(&rt).iter(|| store.claim(&key, &req))
    });
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .namespace("bench")
        .build();
    rt.block_on(async {
        let _ = idem
            .dedup(&OPTS, order_id, async { Ok::<_, Error>(value.clone()) })
            .await;
    });
    g.bench_function("direct-dedup-replay", |b| {
        b.to_async(&rt).iter(|| {
            // The key is completed: the body never runs (and would fail loudly if it did).
            idem.dedup(&OPTS, black_box(order_id), async {
                Err::<Receipt, Error>(Error::Config("a replayed key ran its body".into()))
            })
        })
    });
    g.bench_function("current", |b| b.iter(idem_runtime::current));
    g.bench_function("owner-next", |b| b.iter(Owner::next));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = parts
}
criterion_main!(benches);
