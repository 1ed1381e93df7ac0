use idem_runtime::{Error, IsConflict, retry_on_conflict};

#[derive(Debug)]
struct AppError(Error);

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError(e)
    }
}

impl IsConflict for AppError {
    fn is_conflict(&self) -> bool {
        self.0.is_conflict()
    }
}

// Only an `Err` can say "lost race, run again".
#[retry_on_conflict]
async fn add(n: u64) -> Option<u64> {
    Some(n + 1)
}

fn main() {}
