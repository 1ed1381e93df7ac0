use idem_runtime::{Error, Idem, IsConflict, idempotent, retry_on_conflict};
use idem_runtime::toolbox::{Optimistic, Retry};

#[derive(Debug)]
enum AppError {
    Idem(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e)
    }
}

impl IsConflict for AppError {
    fn is_conflict(&self) -> bool {
        matches!(self, AppError::Idem(e) if e.is_conflict())
    }
}

static POINTS: Optimistic = Optimistic::new("points");

// No options: Retry::DEFAULT. The error type may be idem's own.
#[retry_on_conflict]
async fn defaults(idem: &Idem, user: &str) -> Result<u64, Error> {
    let v = idem.load::<u64>(&POINTS, user).await?;
    let (points, version) = v.map_or((0, 0), |v| (v.value, v.version));
    idem.compare_and_set(&POINTS, user, version, points + 1).await
}

// Every option; owned arguments that the body only borrows; `?` and early `return`.
#[retry_on_conflict(attempts = 50, backoff = "1ms", max_backoff = "50ms")]
async fn all_options(idem: &Idem, user: String, add: u64) -> Result<u64, AppError> {
    if add == 0 {
        return Ok(0);
    }
    let v = idem.load::<u64>(&POINTS, &user).await?;
    let (points, version) = v.map_or((0, 0), |v| (v.value, v.version));
    Ok(idem.compare_and_set(&POINTS, user.as_str(), version, points + add).await?)
}

// One bound only; a `Result` alias that fixes the error type.
type AppResult<T> = Result<T, AppError>;

#[retry_on_conflict(max_backoff = "1s")]
async fn alias(n: u64) -> AppResult<u64> {
    Ok(n)
}

#[retry_on_conflict(backoff = "0ms", attempts = 1)]
async fn one_run() -> Result<(), AppError> {
    Ok(())
}

struct Wallet {
    idem: Idem,
    user: String,
}

impl Wallet {
    #[retry_on_conflict(attempts = 5)]
    async fn add(&self, points: u64) -> Result<u64, AppError> {
        let v = self.idem.load::<u64>(&POINTS, &self.user).await?;
        let (cur, version) = v.map_or((0, 0), |v| (v.value, v.version));
        Ok(self.idem.compare_and_set(&POINTS, &self.user, version, cur + points).await?)
    }

    #[retry_on_conflict]
    async fn generic<N: Into<u64> + Copy>(&self, n: N) -> Result<u64, AppError> {
        Ok(n.into() + self.user.len() as u64)
    }
}

// Above #[idempotent]: the retries run inside one claim. Owned arguments are fine.
#[retry_on_conflict(attempts = 20)]
#[idempotent(key = "credit:{order_id}")]
async fn credit(idem: &Idem, user: String, order_id: u64) -> Result<u64, AppError> {
    let v = idem.load::<u64>(&POINTS, &user).await?;
    let (points, version) = v.map_or((0, 0), |v| (v.value, v.version));
    idem.compare_and_set(&POINTS, &user, version, points + order_id).await?;
    Ok(points + order_id)
}

// The runtime function of the same name is still there.
async fn by_hand(idem: &Idem) -> Result<u64, Error> {
    retry_on_conflict(&Retry::DEFAULT, || defaults(idem, "x")).await
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let idem = Idem::builder().build();
    let wallet = Wallet { idem: idem.clone(), user: "u".into() };
    assert_send(defaults(&idem, "u"));
    assert_send(all_options(&idem, "u".into(), 1));
    assert_send(alias(1));
    assert_send(one_run());
    assert_send(wallet.add(1));
    assert_send(wallet.generic(1u8));
    assert_send(credit(&idem, "u".into(), 1));
    assert_send(by_hand(&idem));
}
