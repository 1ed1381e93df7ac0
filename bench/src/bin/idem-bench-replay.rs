//! The `replay` measurement on its own: `idem-bench-replay [--rounds N] [--calls N]`
//! prints `replay metrics=<on|off> ns/op X ops/s Y` (the best of N rounds, default 5 of
//! 2,000,000 replays). `idem-bench-replay --callgrind N` runs N replays untimed, for
//! `valgrind --tool=callgrind`. `bench/metrics-cost.sh` runs it built with and without
//! the `metrics` feature.

use idem_bench::replay;
use idem_runtime::Error;

fn main() -> Result<(), Error> {
    let mut rounds = 5u32;
    let mut calls = 2_000_000u32;
    let mut callgrind = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |name: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Error::Config(format!("{name} takes a number")))
        };
        match a.as_str() {
            "--rounds" => rounds = u32::try_from(number("--rounds")?).unwrap_or(u32::MAX),
            "--calls" => calls = u32::try_from(number("--calls")?).unwrap_or(u32::MAX),
            "--callgrind" => callgrind = Some(number("--callgrind")?),
            other => return Err(Error::Config(format!("unknown argument {other:?}"))),
        }
    }
    if let Some(n) = callgrind {
        return replay::replay_only(n);
    }
    println!("{}", replay::measure(rounds, calls)?);
    Ok(())
}
