//! What the toolbox examples share: a runtime on the store a URL names.

use std::process::ExitCode;

use idem_runtime::Idem;

/// A runtime on the store at `url` (`memory`, `redis://...`, a SQL URL) under a
/// namespace of its own per run, so runs never see each other's records; or, having
/// said why, the exit code for a bad command line.
pub(crate) async fn open(url: &str, name: &str, seed: u64) -> Result<Idem, ExitCode> {
    match idem_runtime::store::connect(url).await {
        Ok(store) => Ok(Idem::builder()
            .shared_store(store)
            .namespace(format!("{name}-{}-{seed}", std::process::id()))
            .build()),
        Err(e) => {
            eprintln!("store {url}: {e}");
            Err(ExitCode::from(2))
        }
    }
}
