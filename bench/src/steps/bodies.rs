//! The cases' bodies and the operation each case times.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use idem_runtime::{Idem, Key, step};

use super::measure::{Spawn, spawner};
use super::raw::Raw;
use super::{EMPTY, FAIL, Kind, RAW, RESUME, STEPS};
use crate::work::{BenchError, Receipt, STEP_NAMES, receipt};

/// Runs the first `upto` of [`STEP_NAMES`] as steps, each returning `receipt(n + i)`, counts
/// the closures that ran in `ran`, and returns the last value, checked.
async fn steps_body(n: u64, upto: usize, ran: &AtomicU32) -> Result<Receipt, BenchError> {
    let mut last = receipt(n);
    for (i, name) in STEP_NAMES.iter().take(upto).enumerate() {
        let want = receipt(n + i as u64);
        let got: Receipt = step(name, |_| async {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok::<_, BenchError>(want.clone())
        })
        .await?;
        if got != want {
            return Err(BenchError(format!("step {name} gave {got:?}")));
        }
        last = got;
    }
    Ok(last)
}

/// The same values as [`steps_body`], written raw.
async fn raw_body(raw: &Raw, key: &Key, n: u64) -> Result<Receipt, BenchError> {
    let mut last = receipt(n);
    for (i, name) in STEP_NAMES.iter().enumerate() {
        last = receipt(n + i as u64);
        raw.write(key, name, &last).await?;
    }
    raw.done(key);
    Ok(last)
}

/// The value every case's call returns for key `n`.
fn check(got: &Receipt, n: u64) -> Result<(), BenchError> {
    if *got == receipt(n + 2) {
        Ok(())
    } else {
        Err(BenchError(format!("call {n} returned {got:?}")))
    }
}

/// One case's operation on a fresh key `n`: when its timed call began and how long it
/// took. Every case computes the record's key (the raw body needs it), so no case pays
/// for it alone.
pub(super) fn op(kind: Kind, idem: Idem, raw: Raw) -> Spawn {
    match kind {
        Kind::Empty => spawner(move |n| {
            let idem = idem.clone();
            async move {
                let t0 = Instant::now();
                std::hint::black_box(idem.key(&EMPTY, format_args!("{n}")));
                let got = idem
                    .dedup(
                        &EMPTY,
                        n,
                        async move { Ok::<_, BenchError>(receipt(n + 2)) },
                    )
                    .await?;
                let d = t0.elapsed();
                check(&got, n)?;
                Ok((t0, d))
            }
        }),
        Kind::Steps => spawner(move |n| {
            let idem = idem.clone();
            async move {
                let ran = AtomicU32::new(0);
                let t0 = Instant::now();
                std::hint::black_box(idem.key(&STEPS, format_args!("{n}")));
                let got = idem.dedup(&STEPS, n, steps_body(n, 3, &ran)).await?;
                let d = t0.elapsed();
                check(&got, n)?;
                expect_ran(&ran, 3, "a new key")?;
                Ok((t0, d))
            }
        }),
        Kind::Raw => spawner(move |n| {
            let (idem, raw) = (idem.clone(), raw.clone());
            async move {
                let t0 = Instant::now();
                let key = idem.key(&RAW, format_args!("{n}"));
                let got = idem.dedup(&RAW, n, raw_body(&raw, &key, n)).await?;
                let d = t0.elapsed();
                check(&got, n)?;
                Ok((t0, d))
            }
        }),
        Kind::Resume => spawner(move |n| {
            let idem = idem.clone();
            async move {
                // Unmeasured: a first attempt journals two steps, then fails, which
                // releases the key and keeps its journal.
                let ran = AtomicU32::new(0);
                let first = idem
                    .dedup(&RESUME, n, async {
                        steps_body(n, 2, &ran).await?;
                        Err::<Receipt, _>(BenchError(FAIL.to_owned()))
                    })
                    .await;
                match first {
                    Err(BenchError(e)) if e == FAIL => {}
                    Err(e) => return Err(e),
                    Ok(v) => return Err(BenchError(format!("first attempt gave {v:?}"))),
                }
                expect_ran(&ran, 2, "the first attempt")?;
                let ran = AtomicU32::new(0);
                let t0 = Instant::now();
                std::hint::black_box(idem.key(&RESUME, format_args!("{n}")));
                let got = idem.dedup(&RESUME, n, steps_body(n, 3, &ran)).await?;
                let d = t0.elapsed();
                check(&got, n)?;
                expect_ran(&ran, 1, "the resumed attempt")?;
                Ok((t0, d))
            }
        }),
    }
}

fn expect_ran(ran: &AtomicU32, want: u32, what: &str) -> Result<(), BenchError> {
    match ran.load(Ordering::Relaxed) {
        n if n == want => Ok(()),
        n => Err(BenchError(format!(
            "{what} ran {n} step closures, expected {want}"
        ))),
    }
}
