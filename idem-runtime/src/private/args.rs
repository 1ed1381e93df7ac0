//! The recorded arguments of a function marked `recover`, as its expansion writes and
//! its recovery entry reads them: one at a time, each at its parameter's span, so an
//! argument that cannot be recorded is one error there (its bound is `Recorded`).

use std::fmt;

use bytes::Bytes;
use serde::Serialize;

use crate::Error;

/// The arguments of a function marked `recover`, written one at a time: each is
/// MessagePack (the record codec), framed by its length. The attribute spans each
/// `push` at its parameter, so an argument that cannot be recorded is one error there.
#[doc(hidden)]
#[derive(Default)]
pub struct ArgsWriter {
    buf: Vec<u8>,
    failed: Option<String>,
}

impl ArgsWriter {
    /// An empty list.
    pub fn new() -> Self {
        ArgsWriter::default()
    }

    /// Appends one argument, recorded as `O` (its type without a reference).
    pub fn push<O: super::bounds::Recorded<M>, M, B: Serialize + ?Sized>(&mut self, arg: &B) {
        let _ = std::marker::PhantomData::<(O, M)>;
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        if let Err(e) = rmp_serde::encode::write_named(&mut self.buf, arg) {
            self.failed.get_or_insert(e.to_string());
        }
        let len = u32::try_from(self.buf.len() - at - 4).unwrap_or(u32::MAX);
        self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// The arguments, as the claim records them.
    pub fn finish(self, key: &crate::Key) -> Result<Bytes, Error> {
        match self.failed {
            None => Ok(Bytes::from(self.buf)),
            Some(e) => Err(Error::Codec {
                key: *key,
                message: format!("the call's arguments do not serialize for recovery: {e}"),
            }),
        }
    }
}

/// Reads what an [`ArgsWriter`] wrote, one argument at a time.
#[doc(hidden)]
pub struct ArgsReader<'a>(&'a [u8]);

impl<'a> ArgsReader<'a> {
    /// The recorded arguments `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        ArgsReader(bytes)
    }

    /// The next argument, as `O`; the error says why not.
    pub fn read<O: super::bounds::Recorded<M>, M>(&mut self) -> Result<O, String> {
        let undecodable = |why: &dyn fmt::Display| {
            format!("the recorded arguments do not decode into the function's parameters: {why}")
        };
        let (len, rest) = self
            .0
            .split_first_chunk::<4>()
            .ok_or_else(|| undecodable(&"fewer arguments than parameters"))?;
        let len = usize::try_from(u32::from_le_bytes(*len)).unwrap_or(usize::MAX);
        if rest.len() < len {
            return Err(undecodable(&"an argument cut short"));
        }
        let (arg, rest) = rest.split_at(len);
        self.0 = rest;
        rmp_serde::from_slice(arg).map_err(|e| undecodable(&e))
    }

    /// Whether every argument was read (more would mean the function lost parameters).
    pub fn finish(self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(
                "the recorded arguments do not decode into the function's parameters: more \
                 arguments than parameters"
                    .into(),
            )
        }
    }
}
