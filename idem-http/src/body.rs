//! The body types the layer hands its inner service and its caller.
//!
//! A request under the layer reaches the service already buffered (it had to be, to be
//! fingerprinted); a request the layer does not handle streams through untouched. A
//! response is buffered when it is stored, streams untouched when it is not, and streams
//! after its buffered start when it turned out too large to store.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The request body the inner service sees: the buffered bytes of a request the
    /// layer handled (bounded by `max_request_bytes`), or the original body of one it
    /// passed through.
    pub struct RequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestProj]
    enum RequestKind<B> {
        Buffered { data: Option<Bytes> },
        Streaming { #[pin] body: B },
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn buffered(data: Bytes) -> Self {
        RequestBody {
            kind: RequestKind::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        RequestBody {
            kind: RequestKind::Streaming { body },
        }
    }
}

impl<B: Body> Body for RequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            RequestProj::Buffered { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            RequestProj::Streaming { body } => body
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining()))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Buffered { data } => data.is_none(),
            RequestKind::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            RequestKind::Streaming { body } => body.size_hint(),
        }
    }
}

pin_project! {
    /// The response body the layer returns: the inner service's own body when the
    /// response was not stored, or bytes (a stored, replayed or problem response), or
    /// the buffered start of a response too large to store followed by the rest of it.
    pub struct ResponseBody<B: Body> {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseProj]
    enum ResponseKind<B: Body> {
        Full { data: Option<Bytes> },
        Inner { #[pin] body: B },
        // What was read while trying to store a response over `max_response_bytes`,
        // then the rest of the body (boxed: a rare path), or the error it failed with.
        Spilled {
            prefix: VecDeque<Bytes>,
            rest: Option<Pin<Box<B>>>,
            error: Option<B::Error>,
        },
    }
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: ResponseKind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: ResponseKind::Inner { body },
        }
    }

    pub(crate) fn spilled(
        prefix: VecDeque<Bytes>,
        rest: Option<Pin<Box<B>>>,
        error: Option<B::Error>,
    ) -> Self {
        ResponseBody {
            kind: ResponseKind::Spilled {
                prefix,
                rest,
                error,
            },
        }
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            ResponseProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ResponseProj::Inner { body } => poll_bytes(body, cx),
            ResponseProj::Spilled {
                prefix,
                rest,
                error,
            } => {
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                if let Some(e) = error.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                let Some(body) = rest.as_mut() else {
                    return Poll::Ready(None);
                };
                let polled = poll_bytes(body.as_mut(), cx);
                if let Poll::Ready(None) = polled {
                    *rest = None;
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Full { data } => data.is_none(),
            ResponseKind::Inner { body } => body.is_end_stream(),
            ResponseKind::Spilled {
                prefix,
                rest,
                error,
            } => {
                prefix.is_empty()
                    && error.is_none()
                    && rest.as_ref().is_none_or(|b| b.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            ResponseKind::Inner { body } => body.size_hint(),
            ResponseKind::Spilled { prefix, rest, .. } => {
                let read: u64 = prefix.iter().map(|c| c.len() as u64).sum();
                let rest = rest
                    .as_ref()
                    .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint());
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
        }
    }
}

fn poll_bytes<B: Body>(
    body: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
    body.poll_frame(cx)
        .map(|f| f.map(|f| f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))))
}

impl<B: Body> From<Bytes> for ResponseBody<B> {
    fn from(data: Bytes) -> Self {
        ResponseBody::full(data)
    }
}

/// Body bytes read so far. Most bodies arrive in one chunk, which is kept as it came;
/// only a body in several chunks needs a list, and a copy to join them.
#[derive(Default)]
pub(crate) struct Chunks {
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
    len: usize,
}

impl Chunks {
    pub(crate) fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.len += chunk.len();
        if self.first.is_none() {
            self.first = Some(chunk);
        } else {
            self.rest.push_back(chunk);
        }
    }

    /// Bytes read so far.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// All of it, as one buffer.
    pub(crate) fn into_bytes(self) -> Bytes {
        match self.first {
            None => Bytes::new(),
            Some(first) if self.rest.is_empty() => first,
            Some(first) => {
                let mut all = BytesMut::with_capacity(self.len);
                all.extend_from_slice(&first);
                self.rest.iter().for_each(|c| all.extend_from_slice(c));
                all.freeze()
            }
        }
    }

    /// The chunks as they came (to stream them on).
    pub(crate) fn into_list(self) -> VecDeque<Bytes> {
        let mut list = self.rest;
        if let Some(first) = self.first {
            list.push_front(first);
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_join_in_order() {
        let mut c = Chunks::default();
        assert_eq!(c.into_bytes(), Bytes::new());
        c = Chunks::default();
        c.push(Bytes::from_static(b"one"));
        assert_eq!(c.len(), 3);
        assert_eq!(c.into_bytes(), Bytes::from_static(b"one"));
        c = Chunks::default();
        for part in [&b"a"[..], b"", b"bc", b"def"] {
            c.push(Bytes::copy_from_slice(part));
        }
        assert_eq!(c.len(), 6);
        assert_eq!(c.into_bytes(), Bytes::from_static(b"abcdef"));
        c = Chunks::default();
        c.push(Bytes::from_static(b"x"));
        c.push(Bytes::from_static(b"yz"));
        let list: Vec<_> = c.into_list().into_iter().collect();
        assert_eq!(list, [Bytes::from_static(b"x"), Bytes::from_static(b"yz")]);
    }
}
