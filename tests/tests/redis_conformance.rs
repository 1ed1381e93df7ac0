//! The conformance suite on the Redis store: the machine's server on 6379 (standalone)
//! and a private 3-master Cluster started once for this test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;

use std::sync::{Arc, OnceLock};

use idem_runtime::{RedisStore, Store};

idem_runtime::conformance_tests!(standalone, || async {
    Arc::new(RedisStore::connect(harness::shared_url()).expect("store")) as Arc<dyn Store>
});

fn cluster() -> &'static harness::Cluster {
    static CLUSTER: OnceLock<harness::Cluster> = OnceLock::new();
    CLUSTER.get_or_init(harness::Cluster::start)
}

idem_runtime::conformance_tests!(cluster, || async {
    let urls = cluster().urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    Arc::new(RedisStore::connect_cluster(&urls).expect("cluster store")) as Arc<dyn Store>
});

/// A record and its fence counter hash to one Cluster slot (so every script touches one
/// node), and records spread over the masters.
#[test]
fn cluster_record_keys_share_a_slot() {
    let c = cluster();
    let urls = c.urls();
    let store = RedisStore::connect_cluster(&urls).expect("cluster store");
    let mut slots = std::collections::BTreeSet::new();
    for i in 0..64 {
        let key = idem_runtime::Key::from_str("ns", "scope::f", &format!("k{i}"));
        let rec = store.record_name(&key);
        let slot = c.nodes[0].cli(&["CLUSTER", "KEYSLOT", &rec]);
        let fence = c.nodes[0].cli(&["CLUSTER", "KEYSLOT", &format!("{rec}:fence")]);
        assert_eq!(slot.trim(), fence.trim(), "{rec}");
        slots.insert(slot.trim().to_owned());
    }
    assert!(
        slots.len() > 32,
        "records should spread over slots: {}",
        slots.len()
    );
}
