//! The status page's sign-in: a form that takes an API token with the read role and keeps it
//! in the `gitplane-token` cookie (HttpOnly, SameSite=Strict, Secure over TLS), which `authz`
//! accepts on the page's own paths only, for reads only. Every attempt is audited; a client
//! that sends [`LOGIN_TRIES`] wrong tokens in a row waits [`LOGIN_WAIT`] (429) before the next
//! is even checked. See SECURITY.md.

use super::{PageState, esc, html, secure_headers};
use crate::{
    audit::RequestInfo,
    authn::Role,
    listener::{ClientAddr, Transport},
};
use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Wrong tokens a client may send in a row before it must wait.
const LOGIN_TRIES: u32 = 5;
/// How long a client that used up its tries waits.
const LOGIN_WAIT: Duration = Duration::from_secs(60);
/// Clients remembered at most (the oldest go first): an attacker with many addresses costs a
/// bounded table.
const LOGIN_CLIENTS: usize = 4096;

/// Wrong tokens per client: how many in a row, and when the last came.
#[derive(Default)]
pub struct Throttle(Mutex<HashMap<IpAddr, (u32, Instant)>>);

impl Throttle {
    /// How long `client` must still wait, if it used up its tries.
    fn wait(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (count, last) = failures.get(&client)?;
        let until = *last + LOGIN_WAIT;
        (*count >= LOGIN_TRIES && until > now).then(|| until - now)
    }

    fn failed(&self, client: IpAddr, now: Instant) {
        let mut failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= LOGIN_CLIENTS && !failures.contains_key(&client) {
            failures.retain(|_, (_, last)| now.duration_since(*last) < LOGIN_WAIT);
            if failures.len() >= LOGIN_CLIENTS
                && let Some(oldest) = failures.iter().min_by_key(|(_, (_, last))| *last).map(|(ip, _)| *ip)
            {
                failures.remove(&oldest);
            }
        }
        let entry = failures.entry(client).or_insert((0, now));
        // A wait served in full starts the count again.
        if now.duration_since(entry.1) >= LOGIN_WAIT {
            entry.0 = 0;
        }
        *entry = (entry.0 + 1, now);
    }

    fn succeeded(&self, client: IpAddr) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&client);
    }
}

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
    let client = request.extensions().get::<ClientAddr>().map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0);
    let info = RequestInfo::new("POST", "/ui/login", None);
    let audited = |user: &str, response: Response| {
        state.access.audit.record(user, client, &info, response.status().as_u16());
        response
    };
    let now = Instant::now();
    if let Some(wait) = state.login_throttle.wait(client, now) {
        let mut response = login_form(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("Too many wrong tokens from this address: try again in {} s.", wait.as_secs() + 1),
        );
        if let Ok(value) = HeaderValue::from_str(&(wait.as_secs() + 1).to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return audited("system:anonymous", response);
    }
    let Ok(body) = axum::body::to_bytes(request.into_body(), 8 << 10).await else {
        return audited("system:anonymous", login_form(StatusCode::PAYLOAD_TOO_LARGE, "The form was too large."));
    };
    let token = form_value(&body, "token").map(|t| t.trim().to_owned()).unwrap_or_default();
    let user = cookie_safe(&token).then(|| state.access.tokens.authenticate(&token)).flatten();
    match user {
        Some(user) if user.has(Role::Read) => {
            state.login_throttle.succeeded(client);
            let secure = if over_tls { "; Secure" } else { "" };
            let cookie =
                format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE_S}{secure}");
            let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            secure_headers(&mut response);
            audited(&user.name, response)
        }
        Some(user) => audited(&user.name, login_form(StatusCode::FORBIDDEN, "That token lacks the read role.")),
        None => {
            state.login_throttle.failed(client, now);
            audited("system:anonymous", login_form(StatusCode::UNAUTHORIZED, "That token is not valid here."))
        }
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
    fn wrong_tokens_in_a_row_make_a_client_wait() {
        let throttle = Throttle::default();
        let (client, other) = (IpAddr::from([192, 0, 2, 7]), IpAddr::from([192, 0, 2, 8]));
        let start = Instant::now();
        for _ in 0..LOGIN_TRIES {
            assert_eq!(throttle.wait(client, start), None);
            throttle.failed(client, start);
        }
        assert!(throttle.wait(client, start).is_some_and(|w| w <= LOGIN_WAIT));
        assert_eq!(throttle.wait(other, start), None, "another client is not held");
        // Once the wait is served the count starts again; a success forgets the client.
        let later = start + LOGIN_WAIT;
        assert_eq!(throttle.wait(client, later), None);
        throttle.failed(client, later);
        assert_eq!(throttle.wait(client, later), None, "one wrong token after the wait");
        throttle.succeeded(client);
        assert!(throttle.0.lock().unwrap().is_empty());
    }

    #[test]
    fn login_form_values_decode() {
        assert_eq!(form_value(b"a=1&token=ab%2Bc+d", "token").as_deref(), Some("ab+c d"));
        assert_eq!(form_value(b"token=%zz", "token"), None);
        assert!(cookie_safe("e2e-read-token-0123456789abcdef"));
        assert!(!cookie_safe("a;b") && !cookie_safe(""));
    }
}
