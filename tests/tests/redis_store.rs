//! Redis store specifics beyond the conformance suite: round trips per step, record
//! layout and garbage, token leases, wake-ups, timeouts and recovery.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use harness::{Proxy, RedisServer};
use idem_runtime::store::redis::redis::{self, AsyncCommands};
use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use idem_runtime::{Error, Idem, Key, Options, RedisStore, Store};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn idem_on(store: RedisStore, name: &str) -> Idem {
    Idem::builder()
        .store(store)
        .namespace(harness::unique(name))
        .build()
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    harness::raw_connection(url).await
}

static DEDUP: Options = Options::dedup("redis_store::dedup");
static LOCK: Options = Options::lock("redis_store::lock");

/// A key's absolute expiry deadline in ms by the server's clock (`PEXPIRETIME`): exact,
/// where two `PTTL`s read one after the other are not.
async fn expires_at(c: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query_async(c)
        .await
        .unwrap()
}

/// Whether a stepped record outlives its journal after step `after`, by their absolute
/// deadlines.
async fn record_outlives_journal(
    c: &mut redis::aio::MultiplexedConnection,
    record: &str,
    journal: &str,
    after: &str,
) {
    let (rec_at, steps_at) = (expires_at(c, record).await, expires_at(c, journal).await);
    let rec_ttl: i64 = c.pttl(record).await.unwrap();
    assert!(
        rec_ttl > 30_000 && rec_at >= steps_at && steps_at > 0,
        "after {after:?} the record lives as long as its journal: {rec_at} vs {steps_at}"
    );
}

/// The issue's round-trip budget, seen by the server itself (`MONITOR`): a new key is a
/// native `SET NX GET` and a completion script, a replay that one `SET`, and neither
/// touches a step journal; a stepped body adds one script per step, and its resumption
/// one claim script (which hands over the journal); a lock acquire and release one
/// script each, a token issue one `SET` and its consumption two scripts. Also what runs
/// inside each script, so that work on the server stays small. An uncontended call
/// publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_step() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let idem = idem_on(store, "rt");
    let token_opts = Options::token("redis_store::token");
    // Warm up: scripts are loaded on first use (NOSCRIPT, SCRIPT LOAD, EVALSHA).
    let _: u8 = idem
        .dedup(&DEDUP, "warm", async {
            idem_runtime::step("a", |_| async { Ok::<_, Error>(1) }).await
        })
        .await
        .unwrap();
    // The lock key once already, so its fence counter exists (a new one is seeded
    // from the clock).
    idem.lock(&LOCK, "l", async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    let t = idem.issue_token(Duration::from_secs(60)).await.unwrap();
    let _: () = idem
        .consume_token::<idem_runtime::codec::NoReplay, (), Error, _>(&token_opts, &t, async {
            Ok(())
        })
        .await
        .unwrap();
    let monitor = tokio::task::block_in_place(|| harness::Monitor::start(server.port));
    let mut published = 0;
    // (round trips, commands run inside scripts) since the last look, ignoring the
    // pub/sub connection's keep-alive.
    let mut seen = || {
        let all = tokio::task::block_in_place(|| monitor.take());
        published += all.iter().filter(|c| c.name == "publish").count();
        let pick = |top: bool| -> Vec<String> {
            all.iter()
                .filter(|c| c.top == top && c.name != "ping")
                .map(|c| c.name.clone())
                .collect()
        };
        (pick(true), pick(false))
    };

    let _: u8 = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(
        seen(),
        (
            vec!["set".into(), "evalsha".into()],
            vec!["get".into(), "set".into()]
        ),
        "new key: SET NX GET, then the completion script; no journal read or dropped"
    );

    let v: u8 = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(v, 1);
    assert_eq!(
        seen(),
        (vec!["set".into()], vec![]),
        "replay: one SET NX GET"
    );

    // A stepped body: its first step makes the record stepped (the lease deadline moves
    // into the record, the key lives as long as the journal: its expiry is set after the
    // journal's), its second finds the journal's expiry far enough and writes none; the
    // completion drops the journal.
    let stepped = |fail: bool| {
        idem.dedup(&DEDUP, "stepped", async move {
            let a: u8 = idem_runtime::step("a", |_| async { Ok::<_, Error>(1) }).await?;
            let _: u8 = idem_runtime::step("b", |_| async { Ok::<_, Error>(2) }).await?;
            if fail {
                return Err(Error::Config("fails after its step".into()));
            }
            Ok::<_, Error>(a)
        })
    };
    assert!(stepped(true).await.is_err());
    let s = |v: &[&str]| -> Vec<String> { v.iter().map(|c| (*c).to_owned()).collect() };
    assert_eq!(
        seen(),
        (
            s(&["set", "evalsha", "evalsha", "evalsha"]),
            s(&[
                "get", "pttl", "time", "del", "set", "hset", "pexpire", "pexpire", // step 1
                "get", "time", "pttl", "hset", // step 2
                "get", "time", "set", // the release keeps the stepped record
            ])
        ),
        "a stepped body: the claim, one script per step, the release"
    );
    assert_eq!(stepped(false).await.unwrap(), 1);
    assert_eq!(
        seen(),
        (
            s(&["set", "evalsha", "evalsha"]),
            s(&[
                "get", "time", "pttl", "set", "hgetall", // the claim takes the journal
                "get", "time", "set", "del", // the completion drops it
            ])
        ),
        "a resumed body: the claim script hands over the journal, the step is not written"
    );

    idem.lock(&LOCK, "l", async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    assert_eq!(
        seen(),
        (
            vec!["evalsha".into(), "evalsha".into()],
            vec!["set".into(), "incr".into(), "get".into(), "del".into()]
        ),
        "lock: acquire (SET NX PX, fence) + release"
    );

    let t = idem.issue_token(Duration::from_secs(60)).await.unwrap();
    assert_eq!(seen(), (vec!["set".into()], vec![]), "issue: one SET NX PX");
    let _: () = idem
        .consume_token::<idem_runtime::codec::NoReplay, (), Error, _>(&token_opts, &t, async {
            Ok(())
        })
        .await
        .unwrap();
    let (top, _) = seen();
    assert_eq!(
        top,
        vec!["evalsha".to_owned(), "evalsha".to_owned()],
        "consume: claim + complete"
    );
    assert_eq!(published, 0, "uncontended calls publish nothing");
}

/// A server that forgot its scripts (`SCRIPT FLUSH`, as after a restart or a failover)
/// answers `NOSCRIPT`; every primitive loads its script again and carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_a_flush() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let idem = idem_on(store.clone(), "noscript");
    let token_opts = Options::token("redis_store::token");
    for round in 0..3 {
        server.cli(&["SCRIPT", "FLUSH"]);
        let v: u8 = idem
            .dedup(&DEDUP, format_args!("k{round}"), async {
                Ok::<_, Error>(7)
            })
            .await
            .unwrap();
        assert_eq!(v, 7);
        server.cli(&["SCRIPT", "FLUSH"]);
        idem.lock(&LOCK, "l", async { Ok::<_, Error>(()) })
            .await
            .unwrap();
        server.cli(&["SCRIPT", "FLUSH"]);
        let t = idem.issue_token(Duration::from_secs(60)).await.unwrap();
        let _: () = idem
            .consume_token::<idem_runtime::codec::NoReplay, (), Error, _>(&token_opts, &t, async {
                Ok(())
            })
            .await
            .unwrap();
        server.cli(&["SCRIPT", "FLUSH"]);
        let key = idem.key(&DEDUP, format_args!("r{round}"));
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(5000));
        assert_eq!(
            store.claim(&key, &req).await.unwrap(),
            ClaimOutcome::claimed(0)
        );
        server.cli(&["SCRIPT", "FLUSH"]);
        assert!(store.renew(&key, req.owner, ms(5000)).await.unwrap());
        server.cli(&["SCRIPT", "FLUSH"]);
        assert!(store.release(&key, req.owner).await.unwrap());
    }
    assert!(
        server.calls("script|load") >= 12,
        "scripts were loaded again"
    );
}

/// A waiter sets the record's flag, so the completion publishes, and the waiter gets
/// the twin's value (its lease is far longer than its wait, so only a wake-up or a
/// re-check can deliver it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_and_replays() {
    static LONG: Options = Options::dedup("redis_store::wake")
        .lease(Duration::from_secs(60))
        .wait(Duration::from_secs(20));
    let server = RedisServer::start();
    let idem = idem_on(RedisStore::connect(&server.url()).unwrap(), "wake");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let twin = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.dedup(&LONG, "k", async move {
                let _ = rx.await;
                Ok::<_, Error>(7u8)
            })
            .await
        })
    };
    // Wait until the twin holds the key.
    let key = idem.key(&LONG, format_args!("k"));
    loop {
        let probe = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(1));
        if matches!(
            idem.store().claim(&key, &probe).await.unwrap(),
            ClaimOutcome::Busy { .. }
        ) {
            break;
        }
        tokio::time::sleep(ms(5)).await;
    }
    let waiter = {
        let idem = idem.clone();
        tokio::spawn(async move { idem.dedup(&LONG, "k", async { Ok::<_, Error>(9u8) }).await })
    };
    tokio::time::sleep(ms(100)).await;
    tx.send(()).unwrap();
    assert_eq!(twin.await.unwrap().unwrap(), 7);
    assert_eq!(waiter.await.unwrap().unwrap(), 7);
    assert!(
        server.calls("publish") >= 1,
        "the completion notified the waiter"
    );
}

/// Whatever sits under a record's name that is not a record is `Error::Corrupt` on
/// every primitive: never a panic, never a replay, never a body run. Records are
/// strings (see the store's docs for the layout); garbage is any other type, an unknown
/// state byte, or a record cut short or with a field out of place. The in-progress ones
/// carry the caller's own owner, so that completion, release and renewal read past the
/// owner check too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_records_are_corrupt() {
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let idem = idem_on(store.clone(), "garbage");
    let mut c = raw(url).await;
    let owner = Owner::next();
    let me = owner.0.to_be_bytes();
    let with = |head: &[u8], tail: &[u8]| [head, &me[..], tail].concat();
    enum Junk {
        Bytes(Vec<u8>),
        Hash,
        List,
    }
    let garbage: Vec<(&str, Junk)> = vec![
        ("binary junk", Junk::Bytes(b"\x00\xffgarbage".to_vec())),
        ("empty string", Junk::Bytes(vec![])),
        ("unknown state byte", Junk::Bytes(b"zz".to_vec())),
        ("truncated header", Junk::Bytes(b"p".to_vec())),
        (
            "in progress, owner cut short",
            Junk::Bytes(b"p-d\x01\x02".to_vec()),
        ),
        (
            "in progress, bad waited flag",
            Junk::Bytes(with(b"p?d", b"")),
        ),
        (
            "in progress of no known kind",
            Junk::Bytes(with(b"p-z", b"")),
        ),
        (
            "in progress, fingerprint cut short",
            Junk::Bytes(with(b"p-d", b"short")),
        ),
        (
            "token claim without deadlines",
            Junk::Bytes(with(b"p-t", b"")),
        ),
        (
            "stepped claim without its lease deadline",
            Junk::Bytes(with(b"p-s", b"")),
        ),
        (
            "stepped claim with a garbage lease deadline",
            Junk::Bytes(with(b"p-s", &[b'x'; 15])),
        ),
        (
            "stepped claim, deadline cut short",
            Junk::Bytes(with(b"p-s", b"1234")),
        ),
        (
            "token claim with garbage deadlines",
            Junk::Bytes(with(b"p-t", &[b'x'; 30])),
        ),
        ("completed, truncated", Junk::Bytes(b"c".to_vec())),
        ("completed, unknown flag", Junk::Bytes(b"c?value".to_vec())),
        (
            "completed, fingerprint cut short",
            Junk::Bytes(b"cfshort".to_vec()),
        ),
        ("issued, truncated", Junk::Bytes(b"i".to_vec())),
        ("issued, trailing bytes", Junk::Bytes(b"i-x".to_vec())),
        ("a hash where a string is expected", Junk::Hash),
        ("a list where a string is expected", Junk::List),
    ];
    for (i, (what, junk)) in garbage.into_iter().enumerate() {
        let key = idem.key(&DEDUP, format_args!("g{i}"));
        let name = store.record_name(&key);
        match &junk {
            Junk::Bytes(b) => {
                let _: () = c.set(&name, b.as_slice()).await.unwrap();
            }
            Junk::Hash => {
                let _: () = c
                    .hset_multiple(&name, &[("s", "c"), ("v", "ok")])
                    .await
                    .unwrap();
            }
            Junk::List => {
                let _: () = c.rpush(&name, "c-ok").await.unwrap();
            }
        }
        let _: () = c.pexpire(&name, 60_000).await.unwrap();
        for kind in [ClaimKind::Dedup, ClaimKind::Lock, ClaimKind::Token] {
            let req = ClaimRequest::new(kind, owner, ms(5000));
            let r = store.claim(&key, &req).await;
            assert!(
                matches!(r, Err(Error::Corrupt { .. })),
                "{what}, {kind:?} claim: {r:?}"
            );
        }
        let runs = AtomicUsize::new(0);
        let r: Result<u8, Error> = idem
            .dedup(&DEDUP, format_args!("g{i}"), async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(1)
            })
            .await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{what}: {r:?}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "{what}: body ran on garbage"
        );
        let r = store
            .complete(&key, owner, Bytes::from_static(b"v"), ms(1000))
            .await;
        assert!(
            matches!(r, Err(Error::Corrupt { .. })),
            "{what}, complete: {r:?}"
        );
        let r = store.release(&key, owner).await;
        assert!(
            matches!(r, Err(Error::Corrupt { .. })),
            "{what}, release: {r:?}"
        );
        let r = store.renew(&key, owner, ms(1000)).await;
        assert!(
            matches!(r, Err(Error::Corrupt { .. })),
            "{what}, renew: {r:?}"
        );
        // Nothing was overwritten: the garbage is still there for an operator to see.
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query_async(&mut c)
            .await
            .unwrap();
        let expected = match junk {
            Junk::Bytes(_) => "string",
            Junk::Hash => "hash",
            Junk::List => "list",
        };
        assert_eq!(kind, expected, "{what}");
    }
    // An issued token that never expires (someone ran PERSIST on it).
    let key = Key::token(&harness::unique("garbage-tok"), "t");
    assert!(store.issue(&key, Duration::from_secs(30)).await.unwrap());
    let _: () = c.persist(store.record_name(&key)).await.unwrap();
    let r = store
        .claim(&key, &ClaimRequest::new(ClaimKind::Token, owner, ms(1000)))
        .await;
    assert!(
        matches!(r, Err(Error::Corrupt { .. })),
        "persisted token: {r:?}"
    );
    let _: () = c.del(store.record_name(&key)).await.unwrap();
    // A fence counter that is not a number; the failed acquisition leaves no claim.
    let key = idem.key(&LOCK, format_args!("f"));
    let _: () = c
        .set(format!("{}:fence", store.record_name(&key)), "nan")
        .await
        .unwrap();
    let lock = ClaimRequest::new(ClaimKind::Lock, owner, ms(1000));
    assert!(matches!(
        store.claim(&key, &lock).await,
        Err(Error::Corrupt { .. })
    ));
    let exists: bool = c.exists(store.record_name(&key)).await.unwrap();
    assert!(!exists, "a failed lock acquisition left its record");
}

/// A dedup claim's first step makes its record stepped: it keeps its lease deadline and
/// lives as long as the journal, so a release keeps it (deadline all zeros, no record to
/// an operator) and the next claims meet it. Raced by 16 claims of two payloads, only
/// one of the journal's payload takes it over, with its journal; the other payload is
/// refused without changing anything. Renewal moves the deadline, completion drops the
/// journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stepped_records_keep_their_journal_and_its_payload() {
    use idem_runtime::Fingerprint;
    use idem_runtime::inspect::RecordCounts;
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let idem = idem_on(store.clone(), "stepped");
    let key = idem.key(&DEDUP, format_args!("s"));
    let (name, steps) = (
        store.record_name(&key),
        format!("{}:steps", store.record_name(&key)),
    );
    let mut c = raw(url).await;
    let journal = store.journal().unwrap();
    let (fa, fb) = (Some(Fingerprint([0xa; 16])), Some(Fingerprint([0xb; 16])));

    let a = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000)).with_fingerprint(fa);
    assert!(matches!(
        store.claim(&key, &a).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let plain: Vec<u8> = c.get(&name).await.unwrap();
    assert_eq!(&plain[..3], b"p-d", "no step yet: a plain dedup claim");
    let value = Bytes::from_static(b"\x01\x02");
    assert!(
        journal
            .write_step(&key, a.owner, "charge", Some(value), ms(600_000))
            .await
            .unwrap()
    );
    let rec: Vec<u8> = c.get(&name).await.unwrap();
    assert_eq!(
        (&rec[..3], rec.len()),
        (&b"p-s"[..], 50),
        "the first step makes it stepped"
    );
    assert_eq!(&rec[3..19], &a.owner.0.to_be_bytes());
    assert_eq!(&rec[19..35], &[0xa; 16]);
    // The record is never the first of the two to expire, after the first step as after
    // a later one.
    record_outlives_journal(&mut c, &name, &steps, "charge").await;
    let value = Some(Bytes::from_static(b"\x03"));
    assert!(
        journal
            .write_step(&key, a.owner, "ship", value, ms(600_000))
            .await
            .unwrap()
    );
    record_outlives_journal(&mut c, &name, &steps, "ship").await;
    let fp: Vec<u8> = c.hget(&steps, &b"\xff"[..]).await.unwrap();
    assert_eq!(fp, [0xa; 16], "the journal keeps its payload");
    assert!(matches!(store.inspect(&key).await.unwrap(), Some(i) if i.lease_left.is_some()));

    // Released: the record stays for the journal, its deadline zeroed, its expiry kept.
    assert!(store.release(&key, a.owner).await.unwrap());
    let rec: Vec<u8> = c.get(&name).await.unwrap();
    assert_eq!(&rec[..3], b"p-s");
    assert_eq!(&rec[35..], b"000000000000000");
    assert!(c.pttl::<_, i64>(&name).await.unwrap() > 30_000);
    assert!(
        !store.release(&key, a.owner).await.unwrap(),
        "released twice"
    );
    assert_eq!(
        store.inspect(&key).await.unwrap(),
        None,
        "no record to an operator"
    );
    let counts = store.count_records(Some(key.namespace())).await.unwrap();
    assert!(
        counts.is_empty(),
        "a released stepped record is not counted: {counts:?}"
    );

    // 8 claims of each payload at once: exactly one of the journal's takes it over.
    let racers = (0..16).map(|i| {
        let store = store.clone();
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000))
            .with_fingerprint(if i % 2 == 0 { fa } else { fb });
        tokio::spawn(async move { (req.clone(), store.claim(&key, &req).await.unwrap()) })
    });
    let mut winner = None;
    for r in racers {
        let (req, outcome) = r.await.unwrap();
        match (req.fingerprint == fa, outcome) {
            (
                true,
                ClaimOutcome::Claimed {
                    journal: Some(journal),
                    ..
                },
            ) => {
                assert!(winner.is_none(), "two owners took the record");
                let mut names: Vec<&str> = journal.iter().map(|e| e.name.as_str()).collect();
                names.sort_unstable();
                assert_eq!(
                    names,
                    ["charge", "ship"],
                    "the fingerprint field is no step"
                );
                winner = Some(req);
            }
            (_, ClaimOutcome::Busy { fingerprint, .. }) => assert_eq!(fingerprint, fa),
            (false, ClaimOutcome::OtherPayload { fingerprint }) => {
                assert_eq!(Some(fingerprint), fa);
            }
            (ours, other) => panic!("payload a: {ours}, answered {other:?}"),
        }
    }
    let winner = winner.expect("the journal's payload took the record over");
    let rec: Vec<u8> = c.get(&name).await.unwrap();
    // (Its waited flag is set: the losers were answered `Busy`.)
    assert_eq!(
        (rec[0], rec[2], &rec[3..19]),
        (b'p', b's', &winner.owner.0.to_be_bytes()[..])
    );

    // Renewal moves the kept deadline; completion drops the journal.
    let before: u64 = std::str::from_utf8(&rec[35..]).unwrap().parse().unwrap();
    assert!(store.renew(&key, winner.owner, ms(90_000)).await.unwrap());
    let rec: Vec<u8> = c.get(&name).await.unwrap();
    let after: u64 = std::str::from_utf8(&rec[35..]).unwrap().parse().unwrap();
    assert!(
        after >= before + 50_000,
        "the deadline moved: {before} -> {after}"
    );
    assert!(
        store
            .complete(&key, winner.owner, Bytes::from_static(b"ok"), ms(60_000))
            .await
            .unwrap()
    );
    let exists: bool = c.exists(&steps).await.unwrap();
    assert!(!exists, "the completion dropped the journal");
    assert!(matches!(
        store.claim(&key, &ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(100))).await.unwrap(),
        ClaimOutcome::Completed { value, fingerprint } if value == Bytes::from_static(b"ok") && fingerprint == fa
    ));
}

/// A stepped journal lives at least its ttl after each step, by the server's clock, while
/// only the step that finds less left writes an expiry: the first of a lease sets the
/// journal's and the record's to the lease deadline plus the ttl, so a later step of the
/// same lease writes none, and the first step after a renewal has carried the lease past
/// that deadline sets them again from the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_step_keeps_the_journal_a_ttl_ahead() {
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let idem = idem_on(store.clone(), "ttl-ahead");
    let key = idem.key(&DEDUP, format_args!("s"));
    let name = store.record_name(&key);
    let steps = format!("{name}:steps");
    let mut c = raw(url).await;
    let journal = store.journal().unwrap();
    let ttl = 60_000;
    // The server's clock (ms) and the two keys' absolute deadlines.
    let mut clock = async || -> (i64, i64, i64) {
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
        let (rec, jrn) = (
            expires_at(&mut c, &name).await,
            expires_at(&mut c, &steps).await,
        );
        (s * 1000 + us / 1000, rec, jrn)
    };
    let a = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(2_000));
    assert!(matches!(
        store.claim(&key, &a).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let mut step = async |step_name: &str| {
        let before = clock().await.0;
        let value = Some(Bytes::from_static(b"\x01"));
        assert!(
            journal
                .write_step(&key, a.owner, step_name, value, ms(ttl))
                .await
                .unwrap()
        );
        let (_, rec, jrn) = clock().await;
        assert!(
            jrn >= before + ttl as i64 && rec >= jrn,
            "after {step_name:?} the journal lives its ttl and the record as long: {before} {jrn} {rec}"
        );
        (rec, jrn)
    };
    let first = step("charge").await;
    assert_eq!(
        step("reserve").await,
        first,
        "a later step of the lease writes no expiry"
    );
    // A renewal past the first lease's deadline: the next step sets them again.
    assert!(store.renew(&key, a.owner, ms(30_000)).await.unwrap());
    tokio::time::sleep(ms(2_100)).await;
    let renewed = step("mail").await;
    assert!(
        renewed.1 > first.1,
        "the journal's expiry follows the renewed lease"
    );
    assert!(
        store
            .complete(&key, a.owner, Bytes::from_static(b"v"), ms(1_000))
            .await
            .unwrap()
    );
}

/// A journal left without its record (by an idem before stepped records) is never
/// resumed by a plain claim, and its first step starts a journal of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_without_its_record_is_not_resumed() {
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let idem = idem_on(store.clone(), "orphan");
    let key = idem.key(&DEDUP, format_args!("o"));
    let steps = format!("{}:steps", store.record_name(&key));
    let mut c = raw(url).await;
    let _: () = c
        .hset(&steps, "old", "d000000000000001stale")
        .await
        .unwrap();
    let _: () = c.pexpire(&steps, 60_000).await.unwrap();
    let a = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
    assert!(matches!(
        store.claim(&key, &a).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let journal = store.journal().unwrap();
    assert!(
        journal
            .write_step(&key, a.owner, "new", None, ms(60_000))
            .await
            .unwrap()
    );
    let names: Vec<String> = journal
        .read_journal(&key)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["new"]);
}

/// A token claim's journal belongs to its payload too: the token goes back to `Issued`
/// on release (the claim's fingerprint with it), and the journal keeps the payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_journals_belong_to_their_payload() {
    use idem_runtime::Fingerprint;
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let ns: Arc<str> = Arc::from(harness::unique("token-payload").as_str());
    let key = Key::token(&ns, "tok");
    let mut c = raw(url).await;
    let (fa, fb) = (Some(Fingerprint([0xa; 16])), Some(Fingerprint([0xb; 16])));
    assert!(store.issue(&key, Duration::from_secs(30)).await.unwrap());
    let a = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(30_000)).with_fingerprint(fa);
    assert!(matches!(
        store.claim(&key, &a).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let journal = store.journal().unwrap();
    assert!(
        journal
            .write_step(&key, a.owner, "charge", None, ms(60_000))
            .await
            .unwrap()
    );
    assert!(store.release(&key, a.owner).await.unwrap());
    let b = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(30_000)).with_fingerprint(fb);
    assert_eq!(
        store.claim(&key, &b).await.unwrap(),
        ClaimOutcome::OtherPayload {
            fingerprint: Fingerprint([0xa; 16])
        }
    );
    let state: Vec<u8> = c.get(store.record_name(&key)).await.unwrap();
    assert_eq!(state, b"i-", "the refused claim changed nothing");
    let blind = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(30_000));
    assert!(matches!(
        store.claim(&key, &blind).await.unwrap(),
        ClaimOutcome::Claimed {
            journal: Some(_),
            ..
        }
    ));
    assert!(store.release(&key, blind.owner).await.unwrap());
    let again = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(30_000)).with_fingerprint(fa);
    assert!(
        matches!(store.claim(&key, &again).await.unwrap(), ClaimOutcome::Claimed { journal: Some(journal), .. } if journal.len() == 1)
    );
}

/// A released token claim goes back to `Issued` with the token's remaining ttl; a token
/// claim whose lease lapsed can be claimed again, and its old owner can no longer
/// complete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_claims_return_to_issued() {
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let ns: Arc<str> = Arc::from(harness::unique("token").as_str());
    let key = Key::token(&ns, "tok");
    let mut c = raw(url).await;
    assert!(store.issue(&key, Duration::from_secs(30)).await.unwrap());
    assert!(!store.issue(&key, Duration::from_secs(30)).await.unwrap());
    let a = ClaimRequest::new(ClaimKind::Token, Owner::next(), Duration::from_secs(120));
    assert!(matches!(
        store.claim(&key, &a).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let name = store.record_name(&key);
    let pttl: i64 = c.pttl(&name).await.unwrap();
    assert!(
        pttl > 30_000,
        "a claim keeps the record for its lease: {pttl}"
    );
    assert!(store.release(&key, a.owner).await.unwrap());
    let state: Option<Vec<u8>> = c.get(&name).await.unwrap();
    assert_eq!(
        state.as_deref(),
        Some(&b"i-"[..]),
        "back to an issued token"
    );
    let pttl: i64 = c.pttl(&name).await.unwrap();
    assert!(
        pttl > 0 && pttl <= 30_000,
        "back to the token's own ttl: {pttl}"
    );

    let b = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(200));
    assert!(matches!(
        store.claim(&key, &b).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let dedup_probe = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(200));
    assert!(matches!(
        store.claim(&key, &dedup_probe).await.unwrap(),
        ClaimOutcome::Busy { .. }
    ));
    tokio::time::sleep(ms(600)).await;
    let c2 = ClaimRequest::new(ClaimKind::Token, Owner::next(), Duration::from_secs(5));
    assert!(matches!(
        store.claim(&key, &c2).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert!(
        !store
            .complete(&key, b.owner, Bytes::from_static(b"x"), ms(1000))
            .await
            .unwrap()
    );
    assert!(
        store
            .complete(&key, c2.owner, Bytes::from_static(b"y"), ms(5000))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&key, &ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(100))).await.unwrap(),
        ClaimOutcome::Completed { value, .. } if value == Bytes::from_static(b"y")
    ));
    let unknown = Key::token(&ns, "never-issued");
    assert_eq!(
        store.claim(&unknown, &c2).await.unwrap(),
        ClaimOutcome::Missing
    );
}

/// Renewing a token claim moves the lease deadline kept in the record (and the key's
/// expiry with it): past the old lease, the claim is still held and its owner completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_claims_renew_their_lease() {
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let ns: Arc<str> = Arc::from(harness::unique("token-renew").as_str());
    let key = Key::token(&ns, "tok");
    let mut c = raw(url).await;
    assert!(store.issue(&key, ms(2500)).await.unwrap());
    let a = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(1000))
        .with_fingerprint(Some(idem_runtime::Fingerprint([5; 16])));
    assert!(matches!(
        store.claim(&key, &a).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert!(
        store
            .renew(&key, a.owner, Duration::from_secs(5))
            .await
            .unwrap()
    );
    let pttl: i64 = c.pttl(store.record_name(&key)).await.unwrap();
    assert!(
        pttl > 3000,
        "the key lives as long as the renewed lease: {pttl}"
    );
    // Past the first lease (and within the token's ttl).
    tokio::time::sleep(ms(1200)).await;
    let b = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(300));
    match store.claim(&key, &b).await.unwrap() {
        ClaimOutcome::Busy { fingerprint, .. } => {
            assert_eq!(fingerprint, Some(idem_runtime::Fingerprint([5; 16])));
        }
        other => panic!("the renewed claim was taken over: {other:?}"),
    }
    assert!(
        store
            .complete(&key, a.owner, Bytes::from_static(b"done"), ms(5000))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&key, &b).await.unwrap(),
        ClaimOutcome::Completed { value, fingerprint }
            if value == Bytes::from_static(b"done")
                && fingerprint == Some(idem_runtime::Fingerprint([5; 16]))
    ));
}

/// Fences keep increasing after the counter is deleted (it restarts from the clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_survive_a_lost_counter() {
    let url = harness::shared_url();
    let store = RedisStore::connect(url).unwrap();
    let idem = idem_on(store.clone(), "fence");
    let key = idem.key(&LOCK, format_args!("f"));
    let mut c = raw(url).await;
    let mut last = 0;
    for round in 0..4 {
        let req = ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(5000));
        let ClaimOutcome::Claimed { fence, .. } = store.claim(&key, &req).await.unwrap() else {
            panic!("lock not acquired")
        };
        assert!(fence > last, "round {round}: {fence} after {last}");
        last = fence;
        assert!(store.release(&key, req.owner).await.unwrap());
        if round == 1 {
            let _: () = c
                .del(format!("{}:fence", store.record_name(&key)))
                .await
                .unwrap();
        }
    }
}

/// The fence counter's expiry is set when it starts and never pushed back; after it
/// expires, a new counter starts from the clock, above every earlier fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_after_the_counter_expires() {
    let url = harness::shared_url();
    // The counter lives for a lease plus a second at least.
    let store = RedisStore::builder().fence_ttl(ms(1)).connect(url).unwrap();
    let idem = idem_on(store.clone(), "fence-ttl");
    let key = idem.key(&LOCK, format_args!("f"));
    let counter = format!("{}:fence", store.record_name(&key));
    let mut c = raw(url).await;
    let mut last = 0;
    for round in 0..3 {
        // A lease long enough not to lapse on a busy machine before the release.
        let req = ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(500));
        let ClaimOutcome::Claimed { fence, .. } = store.claim(&key, &req).await.unwrap() else {
            panic!("lock not acquired")
        };
        assert!(fence > last, "round {round}: {fence} after {last}");
        last = fence;
        let pttl: i64 = c.pttl(&counter).await.unwrap();
        assert!(
            pttl > 0 && pttl <= 1500,
            "round {round}: counter ttl {pttl}"
        );
        assert!(store.release(&key, req.owner).await.unwrap());
        if round == 1 {
            // Let the counter expire.
            while c.exists::<_, bool>(&counter).await.unwrap() {
                tokio::time::sleep(ms(50)).await;
            }
        }
    }
}

/// Two stores (as two processes would) racing on the same keys: each key's body runs
/// once and every caller of both stores gets its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_race_on_one_key() {
    let url = harness::shared_url();
    let ns = harness::unique("race");
    let a = Idem::builder()
        .store(RedisStore::connect(url).unwrap())
        .namespace(ns.clone())
        .build();
    let b = Idem::builder()
        .store(RedisStore::builder().connections(1).connect(url).unwrap())
        .namespace(ns)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100u64 {
        let idem = if i % 2 == 0 { a.clone() } else { b.clone() };
        let runs = runs.clone();
        tasks.push(tokio::spawn(async move {
            idem.dedup(&DEDUP, "one", async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(50)).await;
                Ok::<_, Error>(i)
            })
            .await
        }));
    }
    let mut values = Vec::new();
    for t in tasks {
        values.push(t.await.unwrap().unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
}

/// A server that does not answer (blackholed) or is not there gives `Error::Store`,
/// and the body never runs without a claim. When it answers again, the same store works
/// without being rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_or_absent_server_is_a_store_error_then_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let store = RedisStore::builder()
        .timeout(ms(300))
        .connect(&proxy.url())
        .unwrap();
    let idem = idem_on(store, "hung");
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(1u8)
    };
    let ok: u8 = idem.dedup(&DEDUP, "a", body()).await.unwrap();
    assert_eq!(ok, 1);

    proxy.blackhole();
    for k in ["b", "c", "d"] {
        let r: Result<u8, Error> = idem.dedup(&DEDUP, k, body()).await;
        assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a body ran without a claim");

    proxy.pass();
    proxy.cut_all();
    // A claim whose reply was lost to the cut may have been applied: its key then stays
    // claimed until its lease ends (never run twice), so every attempt uses a new key.
    static NOWAIT: Options = Options::dedup("redis_store::dedup").wait(Duration::ZERO);
    let mut recovered = false;
    for attempt in 0..50 {
        match idem
            .dedup(&NOWAIT, format_args!("e{attempt}"), body())
            .await
        {
            Ok(1) => {
                recovered = true;
                break;
            }
            Ok(v) => panic!("unexpected {v}"),
            Err(Error::Store(_) | Error::InProgress { .. }) => tokio::time::sleep(ms(100)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        recovered,
        "the store did not recover after the server answered again"
    );

    // Nothing listening at all.
    let nowhere = RedisStore::builder()
        .timeout(ms(300))
        .connect(&format!("redis://127.0.0.1:{}", harness::free_port(false)))
        .unwrap();
    let idem = idem_on(nowhere, "absent");
    let r: Result<u8, Error> = idem.dedup(&DEDUP, "x", body()).await;
    assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Malformed URLs fail at once; a TLS URL without the `tls` feature says so.
#[test]
fn bad_urls_are_config_errors() {
    for url in ["", "http://x", "redis://[::1", "redis://host:notaport"] {
        assert!(
            matches!(RedisStore::connect(url), Err(Error::Config(_))),
            "{url:?}"
        );
    }
    // Password and db index are accepted from the URL.
    assert!(RedisStore::connect("redis://user:secret@127.0.0.1:6379/3").is_ok());
}
