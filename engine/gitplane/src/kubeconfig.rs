//! The kubeconfig a replica writes for its users (`<data-dir>/kubeconfig`, mode 0600: it holds
//! a token): this replica's URL, the cluster CA for an `https://` one, and a `read` token.

use base64::Engine as _;

/// The kubeconfig's text. Values are quoted as JSON strings, which YAML reads alike.
pub fn render(server: &str, ca_pem: Option<&str>, user: &str, token: &str) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let ca = ca_pem
        .map(|pem| {
            format!("    certificate-authority-data: {}\n", base64::engine::general_purpose::STANDARD.encode(pem))
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: gitplane\n  cluster:\n    server: {server}\n{ca}\
         users:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: gitplane\n  context:\n    cluster: gitplane\n    user: {user}\n\
         current-context: gitplane\n",
        server = q(server),
        user = q(user),
        token = q(token),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_names_the_server_ca_and_user() {
        let text = render("https://192.0.2.1:8443", Some("PEM"), "admin", "t0k3n");
        for line in [
            "    server: \"https://192.0.2.1:8443\"",
            "    certificate-authority-data: UEVN",
            "    token: \"t0k3n\"",
            "    user: \"admin\"",
            "current-context: gitplane",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        assert!(!render("http://127.0.0.1:8080", None, "a", "b").contains("certificate-authority"));
    }
}
