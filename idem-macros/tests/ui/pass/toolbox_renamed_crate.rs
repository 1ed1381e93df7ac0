// `crate = "path"` on the toolbox attributes: the expansion goes through that path.
use idem_runtime as renamed;

static ORDER: std::sync::LazyLock<renamed::toolbox::StateMachine> = std::sync::LazyLock::new(|| {
    renamed::toolbox::StateMachine::builder("o")
        .states(["a", "b"])
        .initial("a")
        .allow("a", ["b"])
        .build()
        .expect("valid")
});

#[renamed::retry_on_conflict(attempts = 3, crate = "renamed")]
async fn retried(n: u64) -> Result<u64, renamed::Error> {
    Ok(n)
}

#[renamed::transition(machine = ORDER, key = "{id}", to = "b", crate = "crate::renamed")]
async fn moved(id: u64) -> Result<renamed::toolbox::Moved<u64>, renamed::Error> {
    Ok(id)
}

fn main() {
    let _a = retried(1);
    let _b = moved(1);
}
