//! The conformance suite on the embedded store.

use std::sync::Arc;

use idem_runtime::{MemoryStore, Store};

idem_runtime::conformance_tests!(memory, || async {
    Arc::new(MemoryStore::new()) as Arc<dyn Store>
});
idem_runtime::toolbox_conformance_tests!(memory_toolbox, || async {
    Arc::new(MemoryStore::new()) as Arc<dyn Store>
});
