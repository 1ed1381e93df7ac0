use idem_runtime::retry_on_conflict;

// No `IsConflict`: the attribute could not tell a lost race from a real failure.
#[derive(Debug)]
struct AppError;

#[retry_on_conflict(attempts = 5)]
async fn add(n: u64) -> Result<u64, AppError> {
    Ok(n + 1)
}

fn main() {}
