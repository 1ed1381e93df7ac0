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

// The body runs again after a conflict, so it cannot move its arguments out.
#[retry_on_conflict(attempts = 5)]
async fn rename(name: String) -> Result<String, AppError> {
    Ok(shout(name))
}

fn shout(name: String) -> String {
    name.to_uppercase()
}

fn main() {}
