//! The endpoint's answers: a streamed or whole body, and plain-text errors.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::{Response, StatusCode};
use std::convert::Infallible;

pub(super) type Body = BoxBody<Bytes, Infallible>;

pub(super) fn text(code: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message.to_owned())).boxed());
    *response.status_mut() = code;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    response
}
