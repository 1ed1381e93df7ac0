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
