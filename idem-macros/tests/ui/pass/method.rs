use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

struct Shop {
    name: String,
}

impl Shop {
    #[idempotent(key = "{self.name}:refund:{order_id}", fingerprint = [order_id])]
    async fn refund(&self, order_id: u64) -> Result<String, AppError> {
        Ok(format!("{} refunded {order_id}", self.name))
    }

    // `Self` in the signature and generics on the method.
    #[idempotent(key = "rename:{name}", on_duplicate = "reject")]
    async fn renamed<N: Into<String> + std::fmt::Display>(&self, name: N) -> Result<Self, AppError> {
        Ok(Shop { name: name.into() })
    }
}

// `async fn` in a trait impl.
trait Payments {
    async fn capture(&self, id: u64) -> Result<u64, AppError>;
}

impl Payments for Shop {
    #[idempotent(key = "capture:{id}")]
    async fn capture(&self, id: u64) -> Result<u64, AppError> {
        Ok(id + self.name.len() as u64)
    }
}

fn main() {
    let shop = Shop { name: "s".into() };
    let _a = shop.refund(1);
    let _b = shop.renamed("t");
    let _c = shop.capture(1);
}
