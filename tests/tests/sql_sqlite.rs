//! `SqlStore` on SQLite files: the conformance suite, the shared SQL store tests, and
//! durability across closing and reopening.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
#[macro_use]
mod support;

use std::sync::OnceLock;

/// One database file per test binary run (tests share it, as processes would).
fn url() -> String {
    static PATH: OnceLock<String> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        std::env::temp_dir()
            .join(format!("idem-sqlite-{}.db", support::suffix()))
            .display()
            .to_string()
    });
    format!("sqlite://{path}?mode=rwc")
}

async fn fresh_database() -> String {
    let path = std::env::temp_dir().join(format!("idem-sqlite-mig-{}.db", support::suffix()));
    format!("sqlite://{}?mode=rwc", path.display())
}

async fn drop_database(url: &str) {
    let path = url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

sql_store_tests!(
    db = sqlx::Sqlite,
    pool = sqlite_pool,
    short_blob = "X'010203'"
);

idem_runtime::conformance_tests!(conformance, || async {
    std::sync::Arc::new(super::store().await) as std::sync::Arc<dyn idem_runtime::Store>
});

/// The durable embedded store: completed records and in-progress claims survive the
/// store being closed and the file reopened (a restart of the service).
#[tokio::test]
async fn records_survive_close_and_reopen() {
    let file = fresh_database().await;
    let ns = unique("durable");
    {
        let s = SqlStore::connect(&file).await.unwrap();
        let idem = idem_for(&s, &ns);
        let v: u64 = idem
            .dedup(&DEDUP, "done", async { Ok::<_, Error>(11) })
            .await
            .unwrap();
        assert_eq!(v, 11);
        let key = idem.key(&DEDUP, format_args!("held"));
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(60_000));
        assert!(matches!(
            s.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        s.close().await;
    }
    let s = SqlStore::connect(&file).await.unwrap();
    let idem = idem_for(&s, &ns);
    let runs = AtomicUsize::new(0);
    let v: u64 = idem
        .dedup(&DEDUP, "done", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(12)
        })
        .await
        .unwrap();
    assert_eq!(v, 11, "replayed after reopening");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let key = idem.key(&DEDUP, format_args!("held"));
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(1000));
    assert!(
        matches!(
            s.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Busy { .. }
        ),
        "the claim made before closing still holds"
    );
    s.close().await;
    drop_database(&file).await;
}

/// `sqlite::memory:` works (one shared connection).
#[tokio::test]
async fn in_memory_database() {
    let s = SqlStore::connect("sqlite::memory:").await.unwrap();
    let idem = idem_for(&s, "mem");
    let v: u64 = idem
        .dedup(&DEDUP, 1, async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let w: u64 = idem
        .dedup(&DEDUP, 1, async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!((v, w), (1, 1));
}

// ---- transactional mode in the `idem` span ----

mod tx_span {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use idem_runtime::store::sql::sqlx::{self, Sqlite, Transaction};
    use idem_runtime::{Error, Idem, SqlStore, idempotent};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    #[derive(Default)]
    struct Fields(HashMap<String, String>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
    }

    /// Closed `idem` spans' fields, and the messages of events logged inside one.
    #[derive(Default, Clone)]
    struct Captured {
        spans: Arc<Mutex<Vec<HashMap<String, String>>>>,
        inside: Arc<Mutex<Vec<String>>>,
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(fields);
            }
        }
        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(id)
                && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
            {
                values.record(fields);
            }
        }
        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            if ctx
                .event_span(event)
                .is_some_and(|s| s.name() == idem_runtime::observe::SPAN)
            {
                let mut fields = Fields::default();
                event.record(&mut fields);
                let message = fields.0.remove("message").unwrap_or_default();
                self.inside.lock().unwrap().push(message);
            }
        }
        fn on_close(&self, id: Id, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(&id)
                && span.name() == idem_runtime::observe::SPAN
                && let Some(fields) = span.extensions_mut().remove::<Fields>()
            {
                self.spans.lock().unwrap().push(fields.0);
            }
        }
    }

    #[idempotent(key = "booking:{id}", transaction = tx)]
    async fn book(
        tx: &mut Transaction<'static, Sqlite>,
        id: u64,
        fail: bool,
    ) -> Result<u64, Error> {
        sqlx::query("SELECT 1")
            .execute(&mut **tx)
            .await
            .map_err(Error::store)?;
        tracing::info!("booking in the caller's transaction");
        if fail {
            return Err(Error::Config("declined".into()));
        }
        Ok(id * 10)
    }

    #[test]
    fn transactional_calls_run_in_the_idem_span_with_their_outcome() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::registry().with(captured.clone());
        let _sub = tracing::subscriber::set_default(subscriber);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let store = SqlStore::connect(&super::url()).await.unwrap();
                let pool = store.sqlite_pool().unwrap().clone();
                let ns = super::support::unique("txspan");
                let idem = Idem::builder().store(store).namespace(ns).build();
                idem.scope(async {
                    for (id, fail, want) in
                        [(1, false, Some(10)), (1, false, Some(10)), (2, true, None)]
                    {
                        let mut tx = pool.begin().await.unwrap();
                        let got = book(&mut tx, id, fail).await.ok();
                        assert_eq!(got, want, "booking {id}");
                        tx.commit().await.unwrap();
                    }
                })
                .await;
            });
        let function = format!("{}::book", module_path!());
        let spans: Vec<(String, String, String, bool)> = captured
            .spans
            .lock()
            .unwrap()
            .iter()
            .map(|f| {
                let get = |k: &str| f.get(k).cloned().unwrap_or_default();
                (
                    get("function"),
                    get("strategy"),
                    get("outcome"),
                    get("key").contains('#'),
                )
            })
            .collect();
        let want = |outcome: &str| {
            (
                function.clone(),
                "dedup".to_owned(),
                outcome.to_owned(),
                true,
            )
        };
        // Ran, replayed, and ran again for the failing body (its claim rolled back).
        assert_eq!(spans, [want("ran"), want("replayed"), want("ran")]);
        // The body ran inside the span (twice: the replay did not run it).
        let inside = captured.inside.lock().unwrap().clone();
        let bodies = inside
            .iter()
            .filter(|m| m.as_str() == "booking in the caller's transaction")
            .count();
        assert_eq!(bodies, 2, "{inside:?}");
    }
}
