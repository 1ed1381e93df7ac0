// The runtime under another name: the expansion must not mention `idem_runtime`.
use idem_runtime as renamed;
use renamed::idempotent;

#[derive(Debug)]
struct AppError;

impl From<renamed::Error> for AppError {
    fn from(_: renamed::Error) -> Self {
        AppError
    }
}

mod inner {
    #[derive(Debug)]
    pub struct AppError;

    impl From<crate::renamed::Error> for AppError {
        fn from(_: crate::renamed::Error) -> Self {
            AppError
        }
    }

    #[crate::idempotent(key = "inner:{id}", crate = "crate::renamed")]
    pub async fn inner(id: u64) -> Result<u64, AppError> {
        Ok(id)
    }
}

#[idempotent(key = "charge:{id}", crate = "renamed")]
async fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _a = charge(1);
    let _b = inner::inner(1);
}
