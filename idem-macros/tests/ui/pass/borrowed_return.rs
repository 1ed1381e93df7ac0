use idem_runtime::{Error, idempotent};

struct Shop {
    name: String,
}

impl Shop {
    // A lock replays nothing, so its `Ok` type may borrow, with the lifetime elided.
    #[idempotent(key = "open:{self.name}", strategy = "lock")]
    async fn open(&self) -> Result<&str, Error> {
        Ok(&self.name)
    }

    // The same with `reject`: a duplicate gets `Error::Duplicate`, never a stored value.
    #[idempotent(key = "label:{self.name}", on_duplicate = "reject")]
    async fn label<'a>(&'a self) -> Result<&'a str, Error> {
        Ok(&self.name)
    }
}

fn main() {
    let shop = Shop { name: "s".into() };
    let _ = shop.open();
    let _ = shop.label();
}
