//! The SQL store benchmark on its own: `idem-bench-sql [--secs N] [URL...]`.
//!
//! Without URLs it runs PostgreSQL, MariaDB and a temporary SQLite file on the machine's
//! usual addresses. The same cases run from the main load program with `--sql URL`.

use std::time::Duration;

use idem_bench::sql;

#[tokio::main]
async fn main() -> Result<(), idem_runtime::Error> {
    let mut secs = 3u64;
    let mut urls = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => {
                secs = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| idem_runtime::Error::Config("--secs takes a number".into()))?;
            }
            "--sql" => urls.extend(args.next()),
            url => urls.push(url.to_owned()),
        }
    }
    if urls.is_empty() {
        let sqlite = std::env::temp_dir().join(format!("idem-bench-{}.db", std::process::id()));
        urls = vec![
            "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            "mysql://root@127.0.0.1:3306/test".to_owned(),
            format!("sqlite://{}?mode=rwc", sqlite.display()),
        ];
    }
    for url in &urls {
        sql::run_url(url, Duration::from_secs(secs)).await?;
    }
    Ok(())
}
