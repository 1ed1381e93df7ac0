//! Step journals on the SQL stores (PostgreSQL, MariaDB with and without `RETURNING`,
//! SQLite), beyond the conformance cases: a step write costs that step and never loses
//! an earlier one, a takeover racing the old holder's writes resumes every write that
//! was acknowledged, and on MariaDB a step larger than `max_allowed_packet` is a clear
//! error that leaves the journal as it was, in strict and non-strict `sql_mode` (set on
//! the session only).
//!
//! Needs PostgreSQL on 127.0.0.1:5432 and MariaDB on 127.0.0.1:3306 (see `sql_postgres`
//! and `sql_mysql`); SQLite uses a temporary file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_runtime::codec::FingerprintBuilder;
use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Journal, Owner};
use idem_runtime::{Fingerprint, Key, SqlStore, Store};
use support::{ms, unique};

const TTL: Duration = Duration::from_secs(600);

async fn postgres() -> SqlStore {
    SqlStore::connect(&support::pg_url())
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {}: {e}", support::pg_url()))
}

async fn mariadb() -> SqlStore {
    SqlStore::connect(&support::mysql_url())
        .await
        .unwrap_or_else(|e| panic!("MariaDB/MySQL at {}: {e}", support::mysql_url()))
}

async fn sqlite() -> SqlStore {
    let path = std::env::temp_dir().join(format!("idem-journal-{}.db", support::suffix()));
    SqlStore::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .expect("SQLite store")
}

/// The stores under test, by name (MariaDB twice: with `RETURNING` and without).
async fn stores() -> Vec<(&'static str, SqlStore)> {
    vec![
        ("postgres", postgres().await),
        ("mariadb", mariadb().await),
        (
            "mariadb without RETURNING",
            idem_runtime::__private::without_returning(mariadb().await),
        ),
        ("sqlite", sqlite().await),
    ]
}

fn fp(n: u64) -> Option<Fingerprint> {
    let mut b = FingerprintBuilder::new();
    b.add(&n).unwrap();
    Some(b.finish())
}

fn new_key() -> Key {
    Key::new("sql-journal", "t", format_args!("{}", unique("k")))
}

/// A value whose every byte depends on the step and its position: a swapped, cut or
/// merged entry cannot pass for the right one.
fn value(step: usize, len: usize) -> Bytes {
    (0..len)
        .map(|j| (step.wrapping_mul(31) ^ j ^ (j >> 8)) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn claim(store: &SqlStore, key: &Key, fingerprint: u64) -> (Owner, ClaimOutcome) {
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(60))
        .with_fingerprint(fp(fingerprint));
    let got = store.claim(key, &req).await.unwrap();
    (req.owner, got)
}

/// How many entry rows the key has in `idem_steps`, live or dead.
async fn step_rows(store: &SqlStore, key: &Key) -> i64 {
    rows(store, "idem_steps", key).await
}

/// How many rows of `table` are the key's.
async fn rows(store: &SqlStore, table: &str, key: &Key) -> i64 {
    let hex = key.digest_hex();
    let sql = match store.backend_name() {
        "postgres" => format!("SELECT COUNT(*)::int8 FROM {table} WHERE id = '\\x{hex}'::bytea"),
        _ => format!("SELECT COUNT(*) FROM {table} WHERE id = X'{hex}'"),
    };
    let sql = AssertSqlSafe(sql);
    if let Some(p) = store.pg_pool() {
        sqlx::query_scalar(sql).fetch_one(p).await.unwrap()
    } else if let Some(p) = store.mysql_pool() {
        sqlx::query_scalar(sql).fetch_one(p).await.unwrap()
    } else {
        sqlx::query_scalar(sql)
            .fetch_one(store.sqlite_pool().unwrap())
            .await
            .unwrap()
    }
}

/// `steps` entries `s0`, `s1`, ... (`s0` rewritten), each intact. (The order of a
/// journal's entries is not part of the contract: Redis keeps them in a hash.)
fn assert_entries(label: &str, journal: &Journal, steps: usize, len: usize) {
    assert_eq!(journal.len(), steps, "{label}: entries");
    for i in 0..steps {
        let e = journal.iter().find(|e| e.name == format!("s{i}"));
        let e = e.unwrap_or_else(|| panic!("{label}: s{i} is missing"));
        let want = if i == 0 {
            value(1000, 10)
        } else {
            value(i, len)
        };
        assert!(
            e.value.as_ref() == Some(&want),
            "{label}: step {i} is not intact"
        );
    }
}

/// 100 steps of 100 KB on one record: every entry intact and in order after each
/// batch of writes, a rewrite replaces its entry in place, a takeover resumes all of
/// them, and the completion deletes the rows. Prints what the first and the 100th
/// write took (no bound asserted: the machine is shared; the bench owns the figure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_big_steps_each_intact_and_the_write_costs_that_step() {
    const STEPS: usize = 100;
    const LEN: usize = 100_000;
    for (label, store) in stores().await {
        let journal = store.journal().unwrap();
        let key = new_key();
        let (owner, got) = claim(&store, &key, 7).await;
        assert!(
            matches!(got, ClaimOutcome::Claimed { .. }),
            "{label}: {got:?}"
        );
        let mut took = Vec::with_capacity(STEPS);
        for i in 0..STEPS {
            let (name, v) = (format!("s{i}"), Some(value(i, LEN)));
            let t = Instant::now();
            let ok = journal
                .write_step(&key, owner, &name, v, TTL)
                .await
                .unwrap_or_else(|e| panic!("{label}: write {i} failed: {e:?}"));
            took.push(t.elapsed());
            assert!(ok, "{label}: write {i} refused");
            if i % 25 == 24 {
                let read = journal.read_journal(&key).await.unwrap();
                assert_eq!(read.len(), i + 1, "{label}: after write {i}");
                for (j, e) in read.iter().enumerate() {
                    assert!(
                        e.value.as_ref() == Some(&value(j, LEN)),
                        "{label}: {j} after {i}"
                    );
                }
            }
        }
        let mean = |d: &[Duration]| d.iter().sum::<Duration>() / d.len() as u32;
        println!(
            "{label}: {STEPS} steps of {LEN} bytes: 1st write {:?}, 100th {:?}; \
             mean of the first 10 {:?}, of the last 10 {:?}",
            took[0],
            took[STEPS - 1],
            mean(&took[..10]),
            mean(&took[STEPS - 10..]),
        );
        // A rewrite of the first step replaces it where it was.
        assert!(
            journal
                .write_step(&key, owner, "s0", Some(value(1000, 10)), TTL)
                .await
                .unwrap()
        );
        assert_entries(
            label,
            &journal.read_journal(&key).await.unwrap(),
            STEPS,
            LEN,
        );
        assert!(store.release(&key, owner).await.unwrap());

        let (heir, got) = claim(&store, &key, 7).await;
        match &got {
            ClaimOutcome::Claimed {
                journal: Some(journal),
                ..
            } => assert_entries(label, journal, STEPS, LEN),
            other => panic!("{label}: the takeover did not resume: {other:?}"),
        }
        assert!(
            store
                .complete(&key, heir, Bytes::from_static(b"done"), TTL)
                .await
                .unwrap()
        );
        assert!(
            journal.read_journal(&key).await.unwrap().is_empty(),
            "{label}"
        );
        assert_eq!(
            step_rows(&store, &key).await,
            0,
            "{label}: completion left rows"
        );
    }
}

/// Many concurrent writes by the holder (as `join!` of steps in one body) and rewrites
/// of some names: none loses another's entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_never_lose_an_entry() {
    for (label, store) in stores().await {
        let key = new_key();
        let (owner, _) = claim(&store, &key, 1).await;
        let mut tasks = Vec::new();
        for t in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let journal = store.journal().unwrap();
                for i in 0..25 {
                    let n = t * 25 + i;
                    let name = format!("s{n}");
                    // An intent first, then its result: the result replaces it.
                    assert!(
                        journal
                            .write_step(&key, owner, &name, None, TTL)
                            .await
                            .unwrap()
                    );
                    let v = Some(value(n, 64 + n));
                    assert!(
                        journal
                            .write_step(&key, owner, &name, v, TTL)
                            .await
                            .unwrap()
                    );
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let read = store.journal().unwrap().read_journal(&key).await.unwrap();
        assert_eq!(read.len(), 200, "{label}");
        for n in 0..200 {
            let e = read.iter().find(|e| e.name == format!("s{n}"));
            let e = e.unwrap_or_else(|| panic!("{label}: s{n} lost"));
            assert!(e.value.as_ref() == Some(&value(n, 64 + n)), "{label}: s{n}");
        }
        assert_eq!(
            step_rows(&store, &key).await,
            200,
            "{label}: one row per step"
        );
        assert!(store.release(&key, owner).await.unwrap());
    }
}

/// A holder whose lease runs out keeps writing steps while another caller takes the
/// record over: every write the store acknowledged is in the journal the takeover
/// resumes (none lands after it unseen), and none is acknowledged after the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_resumes_every_acknowledged_write() {
    for (label, store) in stores().await {
        for round in 0..3 {
            let key = new_key();
            let old = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(300));
            assert!(matches!(
                store.claim(&key, &old).await.unwrap(),
                ClaimOutcome::Claimed { .. }
            ));
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let (store, stop) = (store.clone(), stop.clone());
                tokio::spawn(async move {
                    let journal = store.journal().unwrap();
                    let mut acked = Vec::new();
                    let mut i = 0usize;
                    while !stop.load(Ordering::SeqCst) {
                        let name = format!("w{i}");
                        if journal
                            .write_step(&key, old.owner, &name, Some(value(i, 256)), TTL)
                            .await
                            .unwrap()
                        {
                            acked.push(name);
                        }
                        i += 1;
                    }
                    acked
                })
            };
            let new = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(60));
            let resumed = loop {
                match store.claim(&key, &new).await.unwrap() {
                    ClaimOutcome::Busy { .. } => tokio::time::sleep(ms(5)).await,
                    ClaimOutcome::Claimed {
                        journal: Some(journal),
                        ..
                    } => break journal,
                    other => panic!("{label}: {other:?}"),
                }
            };
            stop.store(true, Ordering::SeqCst);
            let acked = writer.await.unwrap();
            assert!(!acked.is_empty(), "{label}: the old holder wrote nothing");
            for name in &acked {
                assert!(
                    resumed.iter().any(|e| &e.name == name),
                    "{label} round {round}: {name} was acknowledged but the takeover \
                     did not resume it ({} acknowledged, {} resumed)",
                    acked.len(),
                    resumed.len()
                );
            }
            assert_eq!(
                resumed.len(),
                acked.len(),
                "{label}: resumed an unacknowledged write"
            );
            assert!(store.release(&key, new.owner).await.unwrap());
        }
    }
}

/// MariaDB/MySQL: a step larger than the server's `max_allowed_packet` is an error that
/// names the limit, the journal keeps every earlier entry, and the next step is written
/// as usual; in strict and in non-strict `sql_mode`, set on the store's sessions only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_past_max_allowed_packet_is_an_error_and_keeps_the_journal() {
    use idem_runtime::store::sql::sqlx::mysql::MySqlPoolOptions;
    for mode in ["STRICT_TRANS_TABLES,STRICT_ALL_TABLES", ""] {
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(format!("SET SESSION sql_mode = '{mode}'")))
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            })
            .connect(&support::mysql_url())
            .await
            .expect("MariaDB");
        let session: String = sqlx::query_scalar("SELECT @@SESSION.sql_mode")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(session.contains("STRICT"), !mode.is_empty(), "{session}");
        let max: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
            .fetch_one(&pool)
            .await
            .unwrap();
        let plain = SqlStore::from_mysql_pool(pool).await.unwrap();
        for store in [
            plain.clone(),
            idem_runtime::__private::without_returning(plain),
        ] {
            let journal = store.journal().unwrap();
            let key = new_key();
            let (owner, _) = claim(&store, &key, 3).await;
            // Enough earlier steps that their sum and the big one exceed the packet.
            let earlier = 3;
            let len = (max as usize) / 2;
            for i in 0..earlier {
                let v = Some(value(i, len));
                assert!(
                    journal
                        .write_step(&key, owner, &format!("s{i}"), v, TTL)
                        .await
                        .unwrap()
                );
            }
            let big = Some(value(9, max as usize + 1));
            let err = journal
                .write_step(&key, owner, "big", big, TTL)
                .await
                .expect_err("a step past max_allowed_packet");
            assert!(
                err.to_string().contains("max_allowed_packet"),
                "mode {mode:?}: an unclear error: {err}"
            );
            let read = journal.read_journal(&key).await.unwrap();
            assert_eq!(read.len(), earlier, "mode {mode:?}: the journal changed");
            for (i, e) in read.iter().enumerate() {
                assert!(
                    e.value.as_ref() == Some(&value(i, len)),
                    "mode {mode:?}: s{i}"
                );
            }
            // The store carries on: the next step is journaled.
            assert!(
                journal
                    .write_step(&key, owner, "after", None, TTL)
                    .await
                    .unwrap()
            );
            assert_eq!(journal.read_journal(&key).await.unwrap().len(), earlier + 1);
            assert!(store.release(&key, owner).await.unwrap());
        }
    }
}

/// A record whose lease and journal both ran out is purged with its journal's rows
/// (PostgreSQL and SQLite at once; MySQL leaves them an hour), and a claim of the same
/// key afterwards starts afresh: no entry of the purged record comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_record_takes_its_journal_along() {
    for (label, store) in stores().await {
        let journal = store.journal().unwrap();
        let key = new_key();
        let old = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(200));
        assert!(matches!(
            store.claim(&key, &old).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        for i in 0..3 {
            let v = Some(value(i, 100));
            assert!(
                journal
                    .write_step(&key, old.owner, &format!("s{i}"), v, ms(200))
                    .await
                    .unwrap()
            );
        }
        assert_eq!(step_rows(&store, &key).await, 3, "{label}");
        tokio::time::sleep(ms(500)).await;
        assert!(
            journal.read_journal(&key).await.unwrap().is_empty(),
            "{label}: expired"
        );
        // Purge until this record's row is gone (other tests' rows may come first).
        for _ in 0..100 {
            store.purge_expired(1000).await.unwrap();
            if rows(&store, "idem_records", &key).await == 0 {
                break;
            }
        }
        assert_eq!(
            rows(&store, "idem_records", &key).await,
            0,
            "{label}: not purged"
        );
        if store.backend_name() != "mysql" {
            assert_eq!(
                step_rows(&store, &key).await,
                0,
                "{label}: rows left behind"
            );
        }
        let (owner, got) = claim(&store, &key, 5).await;
        assert!(
            matches!(got, ClaimOutcome::Claimed { .. }),
            "{label}: a claim after the purge resumed: {got:?}"
        );
        // Its first step starts a journal of one entry, whatever rows the purged record
        // left (MySQL keeps them an hour).
        assert!(
            journal
                .write_step(&key, owner, "s1", None, TTL)
                .await
                .unwrap()
        );
        let read = journal.read_journal(&key).await.unwrap();
        assert_eq!(read.len(), 1, "{label}: {read:?}");
        assert!(read[0].value.is_none(), "{label}: an old entry came back");
        assert!(store.release(&key, owner).await.unwrap());
    }
}

/// A journal written by version 3 (all entries in one value of the record's row) is
/// carried over by migration 4: the record resumes with its entries, and a later step
/// of the same name replaces its entry.
#[tokio::test]
async fn a_version_3_journal_is_carried_over() {
    use idem_runtime::store::sql::sqlx::migrate::{Migration, MigrationType, Migrator};
    use idem_runtime::store::sql::sqlx::{Connection, SqlSafeStr, SqliteConnection};
    let path = std::env::temp_dir().join(format!("idem-journal-v3-{}.db", support::suffix()));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let sql = [
        include_str!("../../idem-runtime/src/store/sql/sqlite_v1.sql"),
        include_str!("../../idem-runtime/src/store/sql/sqlite_v2.sql"),
        include_str!("../../idem-runtime/src/store/sql/sqlite_v3.sql"),
    ];
    let names = ["idem records", "idem toolbox records", "idem step journals"];
    let mut v3 = Migrator::with_migrations(
        (0..3)
            .map(|i| {
                let sql = sql[i].into_sql_str();
                Migration::new(
                    i as i64 + 1,
                    names[i].into(),
                    MigrationType::Simple,
                    sql,
                    false,
                )
            })
            .collect(),
    );
    v3.dangerous_set_table_name("_idem_migrations");
    let mut conn = SqliteConnection::connect(&url).await.unwrap();
    v3.run_direct(None, &mut conn, false).await.unwrap();

    let key = new_key();
    let stamped = |at: u64, name: &str, v: &[u8]| {
        let mut e = format!("{at:016}d").into_bytes();
        e.extend_from_slice(&(name.len() as u16).to_be_bytes());
        e.extend_from_slice(name.as_bytes());
        e.extend_from_slice(&(v.len() as u32).to_be_bytes());
        e.extend_from_slice(v);
        e
    };
    let mut blob = stamped(1_000_000, "charge", b"ch_1");
    blob.extend(stamped(2_000_000, "mail", b"m_1"));
    // A released record (free, expired) whose journal lives for ten more minutes.
    sqlx::query(
        "INSERT INTO idem_records (id, namespace, scope, kind, state, fence, expires_us, steps,
             steps_expires_us)
         VALUES (?1, 'sql-journal', 't', 0, 0, 0, 0, ?2,
             CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) + 600000000)",
    )
    .bind(&key.digest()[..])
    .bind(&blob)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let store = SqlStore::connect(&url)
        .await
        .expect("migrates to version 4");
    let (owner, got) = claim(&store, &key, 1).await;
    let ClaimOutcome::Claimed {
        journal: Some(journal),
        ..
    } = got
    else {
        panic!("the carried-over journal was not resumed: {got:?}");
    };
    let by_name =
        |j: &Journal, n: &str| j.iter().find(|e| e.name == n).and_then(|e| e.value.clone());
    assert_eq!(journal.len(), 2);
    assert_eq!(by_name(&journal, "charge").as_deref(), Some(&b"ch_1"[..]));
    assert_eq!(by_name(&journal, "mail").as_deref(), Some(&b"m_1"[..]));
    let steps = store.journal().unwrap();
    let v = Some(Bytes::from_static(b"m_2"));
    assert!(steps.write_step(&key, owner, "mail", v, TTL).await.unwrap());
    let read = steps.read_journal(&key).await.unwrap();
    assert_eq!(read.len(), 2, "{read:?}");
    assert_eq!(by_name(&read, "mail").as_deref(), Some(&b"m_2"[..]));
    assert_eq!(by_name(&read, "charge").as_deref(), Some(&b"ch_1"[..]));
    store.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
