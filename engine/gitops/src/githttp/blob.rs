//! A read-only file view of hosted repositories for browsers:
//! `GET /git/<name>.git/blob/<commit>/<path>` renders one file of one commit with a numbered
//! anchor per line (`#L12`), where the status page links an error's file and line. It is a Git
//! read: the same token (or the repository's anonymous-read opt-in) as a clone, since the files
//! hold Secrets in the clear. Every byte of the file is escaped; files over [`MAX_BLOB`] and
//! binary files are not shown.

use super::{GitState, anonymous_read, authenticate, not_found, repository, text, unauthorized};
use axum::{
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use gitplane_apiserver::page::esc;
use std::fmt::Write as _;

/// The largest file shown.
pub const MAX_BLOB: usize = 1 << 20;

/// What a browser gets: the file as numbered lines, or why not.
enum Blob {
    Text(String),
    TooLarge(usize),
    Binary,
    Missing(&'static str),
}

fn read(dir: &std::path::Path, commit: &str, path: &str) -> Blob {
    let Ok(git) = git2::Repository::open_bare(dir) else { return Blob::Missing("the repository cannot be read") };
    let Some(commit) = git2::Oid::from_str(commit).ok().and_then(|oid| git.find_commit(oid).ok()) else {
        return Blob::Missing("no such commit");
    };
    let Some(entry) = commit.tree().ok().and_then(|tree| tree.get_path(std::path::Path::new(path)).ok()) else {
        return Blob::Missing("no such file in that commit");
    };
    let Some(blob) = entry.to_object(&git).ok().and_then(|o| o.into_blob().ok()) else {
        return Blob::Missing("not a file");
    };
    if blob.size() > MAX_BLOB {
        return Blob::TooLarge(blob.size());
    }
    if blob.is_binary() {
        return Blob::Binary;
    }
    Blob::Text(String::from_utf8_lossy(blob.content()).into_owned())
}

/// `<commit>/<path>`: a full commit id and a plain relative path.
fn split(rest: &str) -> Option<(&str, &str)> {
    let (commit, path) = rest.split_once('/')?;
    let commit_ok = commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit());
    let path_ok = !path.is_empty() && path.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
    (commit_ok && path_ok).then_some((commit, path))
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title} · gitplane</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/page.css\"></head><body>\
         <header><span class=\"brand\">gitplane</span><nav aria-label=\"Main\"><a href=\"/\">Applications</a></nav></header>\
         <main id=\"main\"><h1>{title}</h1>{body}</main></body></html>\n",
        title = esc(title)
    )
}

pub(super) async fn serve(
    State(state): State<GitState>,
    Path((repo, rest)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if state.token.is_none() {
        return text(StatusCode::FORBIDDEN, "Git over HTTP is disabled: no token is configured on this server");
    }
    let user = match authenticate(&state, &headers) {
        Ok(user) => user,
        Err(why) => return unauthorized(why),
    };
    let dir_name = repository(&state, &repo);
    let anonymous_ok = dir_name.as_ref().is_some_and(|name| anonymous_read(&state.repos_dir.join(name)));
    if user.is_none() && !anonymous_ok {
        return unauthorized("this needs gitplane's Git token (any user name, the token as password)");
    }
    let Some(dir_name) = dir_name else { return not_found(&repo) };
    let Some((commit, path)) = split(&rest) else {
        return text(StatusCode::NOT_FOUND, "the file view's path is <commit id>/<file path>");
    };
    let dir = state.repos_dir.join(&dir_name);
    let (commit_owned, path_owned) = (commit.to_owned(), path.to_owned());
    let blob = tokio::task::spawn_blocking(move || read(&dir, &commit_owned, &path_owned))
        .await
        .unwrap_or(Blob::Missing("the file could not be read"));
    let title = format!("{}: {path}", dir_name.trim_end_matches(".git"));
    let heading = format!("<p class=\"muted\">commit <code>{}</code></p>", esc(commit));
    let (code, body) = match blob {
        Blob::Text(content) => {
            let mut body = heading;
            body.push_str("<table class=\"blob\"><tbody>");
            for (i, line) in content.lines().enumerate() {
                let n = i + 1;
                let _ = write!(
                    body,
                    "<tr id=\"L{n}\"><td class=\"ln\"><a href=\"#L{n}\">{n}</a></td><td><pre>{}</pre></td></tr>",
                    esc(line)
                );
            }
            body.push_str("</tbody></table>");
            (StatusCode::OK, body)
        }
        Blob::TooLarge(size) => (
            StatusCode::OK,
            format!("{heading}<p>The file is {size} bytes: larger than the {MAX_BLOB} bytes shown here.</p>"),
        ),
        Blob::Binary => (StatusCode::OK, format!("{heading}<p>A binary file.</p>")),
        Blob::Missing(why) => (StatusCode::NOT_FOUND, format!("{heading}<p>{}</p>", esc(why))),
    };
    let mut response =
        (code, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page(&title, &body)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'self'; base-uri 'none'; frame-ancestors 'none'"),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_a_commit_and_a_plain_file() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(split(&format!("{id}/apps/web.yaml")), Some((id, "apps/web.yaml")));
        assert_eq!(split(&format!("{id}/../x")), None);
        assert_eq!(split(&format!("{id}/a//b")), None);
        assert_eq!(split("main/web.yaml"), None);
        assert_eq!(split(id), None);
    }
}
