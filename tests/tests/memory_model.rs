//! Model-based tests of `MemoryStore`: random sequences of store operations and clock
//! advances, checked step by step against a small reference model of the record life
//! cycle (the `Store` trait's docs), on tokio's paused clock so every expiry boundary is exact.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use idem_runtime::{Fingerprint, Key, MemoryStore, Store};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: u8,
        owner: u8,
        lease: u16,
        fp: u8,
    },
    Complete {
        key: u8,
        owner: u8,
        value: u8,
        ttl: u16,
    },
    Release {
        key: u8,
        owner: u8,
    },
    Renew {
        key: u8,
        owner: u8,
        lease: u16,
    },
    Issue {
        key: u8,
        ttl: u16,
    },
    Advance {
        ms: u16,
    },
}

const KEYS: u8 = 5;

/// Keys 0 and 1 are dedup records, 2 a lock, 3 and 4 tokens: a key is only ever used
/// with one kind, as through the runtime (their scopes differ).
fn kind(key: u8) -> ClaimKind {
    match key {
        0 | 1 => ClaimKind::Dedup,
        2 => ClaimKind::Lock,
        _ => ClaimKind::Token,
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0..4u8, 1..400u16, 0..2u8)
            .prop_map(|(key, owner, lease, fp)| Op::Claim { key, owner, lease, fp }),
        2 => (0..KEYS, 0..4u8, 0..4u8, 1..800u16)
            .prop_map(|(key, owner, value, ttl)| Op::Complete { key, owner, value, ttl }),
        2 => (0..KEYS, 0..4u8).prop_map(|(key, owner)| Op::Release { key, owner }),
        1 => (0..KEYS, 0..4u8, 1..400u16).prop_map(|(key, owner, lease)| Op::Renew { key, owner, lease }),
        1 => (3..KEYS, 1..800u16).prop_map(|(key, ttl)| Op::Issue { key, ttl }),
        3 => (0..500u16).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// The reference: times in ms since the start, no sharding, no sweeping.
#[derive(Debug, Clone)]
enum MState {
    Issued,
    Held {
        owner: u8,
        lease_until: u64,
        token_expires: Option<u64>,
    },
    Done {
        value: u8,
    },
}

#[derive(Debug, Clone)]
struct MEntry {
    state: MState,
    fp: Option<u8>,
    expires_at: u64,
}

#[derive(Default)]
struct Model {
    now: u64,
    records: HashMap<u8, MEntry>,
}

#[derive(Debug, PartialEq)]
enum Expect {
    Claimed,
    Busy { retry_in: u64, fp: Option<u8> },
    Completed { value: u8, fp: Option<u8> },
    Missing,
    Bool(bool),
}

impl Model {
    fn live(&mut self, key: u8) -> Option<&mut MEntry> {
        let now = self.now;
        if self.records.get(&key).is_some_and(|e| e.expires_at <= now) {
            self.records.remove(&key);
        }
        self.records.get_mut(&key)
    }

    fn apply(&mut self, op: &Op) -> Option<Expect> {
        let now = self.now;
        Some(match *op {
            Op::Advance { ms } => {
                self.now += u64::from(ms);
                return None;
            }
            Op::Claim {
                key,
                owner,
                lease,
                fp,
            } => {
                let lease_until = now + u64::from(lease);
                let k = kind(key);
                match self.live(key) {
                    Some(e) => match e.state.clone() {
                        MState::Done { value } => Expect::Completed { value, fp: e.fp },
                        MState::Held {
                            lease_until: held,
                            token_expires,
                            ..
                        } if held <= now && k == ClaimKind::Token => {
                            let t = token_expires.unwrap_or(e.expires_at);
                            *e = MEntry {
                                state: MState::Held {
                                    owner,
                                    lease_until,
                                    token_expires: Some(t),
                                },
                                fp: Some(fp),
                                expires_at: t.max(lease_until),
                            };
                            Expect::Claimed
                        }
                        MState::Held {
                            lease_until: held, ..
                        } => Expect::Busy {
                            retry_in: held.saturating_sub(now),
                            fp: e.fp,
                        },
                        MState::Issued => {
                            let t = e.expires_at;
                            *e = MEntry {
                                state: MState::Held {
                                    owner,
                                    lease_until,
                                    token_expires: Some(t),
                                },
                                fp: Some(fp),
                                expires_at: t.max(lease_until),
                            };
                            Expect::Claimed
                        }
                    },
                    None if k == ClaimKind::Token => Expect::Missing,
                    None => {
                        self.records.insert(
                            key,
                            MEntry {
                                state: MState::Held {
                                    owner,
                                    lease_until,
                                    token_expires: None,
                                },
                                fp: Some(fp),
                                expires_at: lease_until,
                            },
                        );
                        Expect::Claimed
                    }
                }
            }
            Op::Complete {
                key,
                owner,
                value,
                ttl,
            } => Expect::Bool(match self.live(key) {
                Some(e) => match e.state {
                    MState::Held {
                        owner: o,
                        lease_until,
                        ..
                    } if o == owner && lease_until > now => {
                        e.state = MState::Done { value };
                        e.expires_at = now + u64::from(ttl);
                        true
                    }
                    _ => false,
                },
                None => false,
            }),
            Op::Release { key, owner } => Expect::Bool(match self.live(key) {
                Some(e) => match e.state {
                    MState::Held {
                        owner: o,
                        token_expires,
                        ..
                    } if o == owner => {
                        match token_expires {
                            Some(t) if t > now => {
                                *e = MEntry {
                                    state: MState::Issued,
                                    fp: None,
                                    expires_at: t,
                                };
                            }
                            _ => {
                                self.records.remove(&key);
                            }
                        }
                        true
                    }
                    _ => false,
                },
                None => false,
            }),
            Op::Renew { key, owner, lease } => Expect::Bool(match self.live(key) {
                Some(e) => match &mut e.state {
                    MState::Held {
                        owner: o,
                        lease_until,
                        token_expires,
                    } if *o == owner && *lease_until > now => {
                        *lease_until = now + u64::from(lease);
                        e.expires_at = token_expires.map_or(*lease_until, |t| t.max(*lease_until));
                        true
                    }
                    _ => false,
                },
                None => false,
            }),
            Op::Issue { key, ttl } => Expect::Bool(if self.live(key).is_some() {
                false
            } else {
                self.records.insert(
                    key,
                    MEntry {
                        state: MState::Issued,
                        fp: None,
                        expires_at: now + u64::from(ttl),
                    },
                );
                true
            }),
        })
    }
}

fn owner(o: u8) -> Owner {
    Owner(0xabc0 + u128::from(o))
}

fn fingerprint(f: u8) -> Fingerprint {
    Fingerprint([f; 16])
}

async fn run_store(
    store: &MemoryStore,
    keys: &[Key],
    op: &Op,
    last_fence: &mut u64,
) -> Option<Expect> {
    let ms = |n: u16| Duration::from_millis(u64::from(n));
    Some(match *op {
        Op::Advance { ms: n } => {
            tokio::time::advance(ms(n)).await;
            return None;
        }
        Op::Claim {
            key,
            owner: o,
            lease,
            fp,
        } => {
            let req = ClaimRequest::new(kind(key), owner(o), ms(lease))
                .with_fingerprint(Some(fingerprint(fp)));
            match store.claim(&keys[key as usize], &req).await.unwrap() {
                ClaimOutcome::Claimed { fence, .. } => {
                    if kind(key) == ClaimKind::Lock {
                        assert!(fence > *last_fence, "fence {fence} after {last_fence}");
                        *last_fence = fence;
                    }
                    Expect::Claimed
                }
                ClaimOutcome::Busy {
                    retry_in,
                    fingerprint: f,
                } => Expect::Busy {
                    retry_in: retry_in.as_millis() as u64,
                    fp: f.map(|f| f.0[0]),
                },
                ClaimOutcome::Completed {
                    value,
                    fingerprint: f,
                } => Expect::Completed {
                    value: value[0],
                    fp: f.map(|f| f.0[0]),
                },
                ClaimOutcome::Missing => Expect::Missing,
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        Op::Complete {
            key,
            owner: o,
            value,
            ttl,
        } => Expect::Bool(
            store
                .complete(
                    &keys[key as usize],
                    owner(o),
                    Bytes::from(vec![value]),
                    ms(ttl),
                )
                .await
                .unwrap(),
        ),
        Op::Release { key, owner: o } => {
            Expect::Bool(store.release(&keys[key as usize], owner(o)).await.unwrap())
        }
        Op::Renew {
            key,
            owner: o,
            lease,
        } => Expect::Bool(
            store
                .renew(&keys[key as usize], owner(o), ms(lease))
                .await
                .unwrap(),
        ),
        Op::Issue { key, ttl } => {
            Expect::Bool(store.issue(&keys[key as usize], ms(ttl)).await.unwrap())
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let store = MemoryStore::new();
            let ns: Arc<str> = Arc::from("model");
            let keys: Vec<Key> = (0..KEYS).map(|k| Key::from_str(&ns, "f", &k.to_string())).collect();
            let mut model = Model::default();
            let mut fence = 0;
            for (i, op) in ops.iter().enumerate() {
                let want = model.apply(op);
                let got = run_store(&store, &keys, op, &mut fence).await;
                assert_eq!(got, want, "step {i}: {op:?}");
            }
        });
    }
}

/// A stream of distinct keys with a short ttl keeps the store's size bounded: expired
/// records are swept as shards grow.
#[tokio::test(start_paused = true)]
async fn memory_stays_bounded_under_distinct_keys() {
    let store = MemoryStore::new();
    let ns: Arc<str> = Arc::from("bounded");
    let mut peak = 0;
    for i in 0..200_000u32 {
        let key = Key::from_str(&ns, "f", &i.to_string());
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(30));
        assert!(matches!(
            store.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        assert!(
            store
                .complete(
                    &key,
                    req.owner,
                    Bytes::from_static(b"v"),
                    Duration::from_millis(100)
                )
                .await
                .unwrap()
        );
        // 1,000 keys per simulated 10 ms: about 10,000 are live at any time.
        if i % 100 == 0 {
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        if i % 10_000 == 0 {
            peak = peak.max(store.len());
        }
    }
    peak = peak.max(store.len());
    assert!(
        peak < 40_000,
        "memory grew with the stream: {peak} records held"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    store.purge_expired();
    assert_eq!(store.len(), 0);
}
