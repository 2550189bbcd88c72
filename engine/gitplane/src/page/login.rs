//! The status page's sign-in: a form that takes an API token with the read role and keeps it
//! in the `gitplane-token` cookie (HttpOnly, SameSite=Strict, Secure over TLS), which `authz`
//! accepts on the page's own paths only. See SECURITY.md.

use super::{PageState, esc, html, secure_headers};
use crate::{authn::Role, listener::Transport};
use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

/// The cookie the login form sets, holding an API token.
pub const COOKIE: &str = "gitplane-token";
/// How long the cookie lasts.
const COOKIE_MAX_AGE_S: u32 = 12 * 3600;

/// The login form: a token with the read role, kept in an HttpOnly cookie.
pub fn login_form(code: StatusCode, message: &str) -> Response {
    let note = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" role=\"alert\">{}</p>", esc(message))
    };
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>Sign in · gitplane</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/page.css\"></head><body>\
         <main id=\"main\" class=\"login\"><h1>gitplane</h1>{note}\
         <form method=\"post\" action=\"/ui/login\"><label for=\"token\">API token (read role)</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"hint\">The token is in the kubeconfig <code>gitplane up</code> or <code>gitplane server</code> \
         wrote (<code>&lt;data-dir&gt;/kubeconfig</code>). It is kept in an HttpOnly cookie for this site only.</p>\
         </main></body></html>\n"
    );
    html(code, body)
}

/// `application/x-www-form-urlencoded` value decoding.
fn form_value(body: &[u8], field: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw = text.split('&').find_map(|pair| pair.strip_prefix(field)?.strip_prefix('='))?;
    let mut bytes = Vec::with_capacity(raw.len());
    let mut input = raw.bytes();
    while let Some(b) = input.next() {
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = [input.next()?, input.next()?];
                bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

/// Characters a token may have to travel in a cookie unquoted.
fn cookie_safe(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
}

pub(super) async fn login(State(state): State<PageState>, request: axum::extract::Request) -> Response {
    let over_tls = request.extensions().get::<Transport>().is_some_and(|t| matches!(t, Transport::Tls(_)));
    let Ok(body) = axum::body::to_bytes(request.into_body(), 8 << 10).await else {
        return login_form(StatusCode::PAYLOAD_TOO_LARGE, "The form was too large.");
    };
    let token = form_value(&body, "token").map(|t| t.trim().to_owned()).unwrap_or_default();
    let user = cookie_safe(&token).then(|| state.tokens.authenticate(&token)).flatten();
    match user {
        Some(user) if user.has(Role::Read) => {
            let secure = if over_tls { "; Secure" } else { "" };
            let cookie =
                format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE_S}{secure}");
            let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            secure_headers(&mut response);
            response
        }
        Some(_) => login_form(StatusCode::FORBIDDEN, "That token lacks the read role."),
        None => login_form(StatusCode::UNAUTHORIZED, "That token is not valid here."),
    }
}

pub(super) async fn logout(transport: Option<axum::Extension<Transport>>) -> Response {
    let secure = if transport.is_some_and(|t| matches!(t.0, Transport::Tls(_))) { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}");
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui/login")]).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_form_values_decode() {
        assert_eq!(form_value(b"a=1&token=ab%2Bc+d", "token").as_deref(), Some("ab+c d"));
        assert_eq!(form_value(b"token=%zz", "token"), None);
        assert!(cookie_safe("e2e-read-token-0123456789abcdef"));
        assert!(!cookie_safe("a;b") && !cookie_safe(""));
    }
}
