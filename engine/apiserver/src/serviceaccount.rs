//! Bound service account tokens, as kube-apiserver's TokenRequest issues them and its
//! service-account authenticator checks them: compact JWS (ES256, P-256 with SHA-256) with the
//! claims `iss`, `sub` (`system:serviceaccount:<namespace>:<name>`), `aud`, `exp`, `iat`,
//! `nbf`, `jti` and `kubernetes.io` (the namespace, the Pod and the ServiceAccount it is bound
//! to, with their uids, and the node). Pure: time is given, keys are bytes; whether the bound
//! Pod still exists is the caller's question ([`crate::authn::ServiceAccountTokens`]).

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _},
};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The issuer, and the audience tokens carry unless asked for others (kube-apiserver's
/// `--service-account-issuer` as kubeadm sets it; `--api-audiences` defaults to it).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// How long a token lives unless asked otherwise: an hour, as the kubelet asks for the
/// automounted token (3607 s).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3607;
/// The shortest life TokenRequest gives (kube-apiserver refuses less than ten minutes; the
/// control plane's `--service-account-max-token-expiration` may cap it lower, for tests).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The clock skew `nbf` and `exp` are checked with, as kube-apiserver's validator allows.
const LEEWAY_SECONDS: i64 = 60;

/// The user a ServiceAccount's token authenticates as.
pub fn username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups of a ServiceAccount's user.
pub fn groups(namespace: &str) -> Vec<String> {
    vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}"), "system:authenticated".into()]
}

/// An object a token is bound to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub namespace: String,
    pub pod: Ref,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
}

/// A token's claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Binding,
}

impl Claims {
    /// The claims of a token bound to `binding`, issued at `now` (Unix seconds) for `ttl`.
    pub fn new(binding: Binding, audiences: Vec<String>, now: i64, ttl: i64) -> Claims {
        Claims {
            iss: ISSUER.into(),
            sub: username(&binding.namespace, &binding.serviceaccount.name),
            aud: audiences,
            exp: now + ttl,
            iat: now,
            nbf: now,
            jti: hex::encode(rand::random::<[u8; 16]>()),
            kubernetes: binding,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    kid: String,
}

/// Why a token is refused (never quoting it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a JWT")]
    Malformed,
    #[error("not signed by a service account key of this cluster")]
    Signature,
    #[error("issued by {0:?}, not this cluster")]
    Issuer(String),
    #[error("not for this audience")]
    Audience,
    #[error("expired")]
    Expired,
    #[error("not valid yet")]
    NotYetValid,
}

/// Where every replica publishes its public key (`<key id>: <base64 point>`), so that each
/// accepts the tokens every other one issued.
pub const PUBLISHED_KEYS_NAMESPACE: &str = "kube-system";
pub const PUBLISHED_KEYS_NAME: &str = "gitplane-service-account-keys";

/// The key id kube-apiserver gives a public key: the SHA-256 of its DER (here, of its
/// uncompressed point), base64url.
pub fn key_id(public_key: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(public_key))
}

/// The control plane's signing key.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    kid: String,
}

impl SigningKey {
    /// A new key, as PKCS#8 (what the key file holds).
    pub fn generate_pkcs8() -> anyhow::Result<Vec<u8>> {
        let document = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
            .map_err(|_| anyhow::anyhow!("making a P-256 key failed"))?;
        Ok(document.as_ref().to_vec())
    }

    pub fn from_pkcs8(der: &[u8]) -> anyhow::Result<SigningKey> {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &SystemRandom::new())
            .map_err(|e| anyhow::anyhow!("not a P-256 PKCS#8 key: {e}"))?;
        let kid = key_id(pair.public_key().as_ref());
        Ok(SigningKey { pair, kid })
    }

    /// The public key (the uncompressed point), which verifiers hold.
    pub fn public_key(&self) -> Vec<u8> {
        self.pair.public_key().as_ref().to_vec()
    }

    /// The signed token of `claims`.
    pub fn sign(&self, claims: &Claims) -> anyhow::Result<String> {
        let header = Header { alg: "ES256".into(), kid: self.kid.clone() };
        let mut token = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?);
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims)?));
        let signature =
            self.pair.sign(&SystemRandom::new(), token.as_bytes()).map_err(|_| anyhow::anyhow!("signing failed"))?;
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature.as_ref()));
        Ok(token)
    }
}

/// The public keys tokens may be signed with.
#[derive(Clone, Debug, Default)]
pub struct VerifyingKeys {
    keys: Vec<(String, Vec<u8>)>,
}

impl VerifyingKeys {
    pub fn new(public_keys: impl IntoIterator<Item = Vec<u8>>) -> VerifyingKeys {
        VerifyingKeys { keys: public_keys.into_iter().map(|k| (key_id(&k), k)).collect() }
    }

    /// The public keys a published-keys ConfigMap holds (entries that do not decode are skipped).
    pub fn published(config_map: &serde_json::Value) -> Vec<Vec<u8>> {
        use base64::engine::general_purpose::STANDARD;
        config_map["data"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| STANDARD.decode(v.as_str()?).ok())
            .collect()
    }

    /// These keys and `more`.
    pub fn with(&self, more: impl IntoIterator<Item = Vec<u8>>) -> VerifyingKeys {
        let mut keys = self.keys.clone();
        for key in more {
            let kid = key_id(&key);
            if !keys.iter().any(|(k, _)| *k == kid) {
                keys.push((kid, key));
            }
        }
        VerifyingKeys { keys }
    }

    /// Whether `token` looks like a JWT at all (so a static token is not tried as one).
    pub fn looks_like_jwt(token: &str) -> bool {
        token.starts_with("eyJ") && token.bytes().filter(|b| *b == b'.').count() == 2
    }

    /// The claims of `token` if one of these keys signed it, this cluster issued it for
    /// `audience`, and it is valid at `now` (Unix seconds).
    pub fn verify(&self, token: &str, audience: &str, now: i64) -> Result<Claims, TokenError> {
        let (signed, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (header, payload) = signed.split_once('.').ok_or(TokenError::Malformed)?;
        let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|_| TokenError::Malformed);
        let header: Header = serde_json::from_slice(&decode(header)?).map_err(|_| TokenError::Malformed)?;
        if header.alg != "ES256" {
            return Err(TokenError::Signature);
        }
        let signature = decode(signature)?;
        let key = self.keys.iter().find(|(kid, _)| *kid == header.kid).ok_or(TokenError::Signature)?;
        ring::signature::UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &key.1)
            .verify(signed.as_bytes(), &signature)
            .map_err(|_| TokenError::Signature)?;
        let claims: Claims = serde_json::from_slice(&decode(payload)?).map_err(|_| TokenError::Malformed)?;
        if claims.iss != ISSUER {
            return Err(TokenError::Issuer(claims.iss));
        }
        if !claims.aud.iter().any(|a| a == audience) {
            return Err(TokenError::Audience);
        }
        if now > claims.exp + LEEWAY_SECONDS {
            return Err(TokenError::Expired);
        }
        if now + LEEWAY_SECONDS < claims.nbf {
            return Err(TokenError::NotYetValid);
        }
        if claims.sub != username(&claims.kubernetes.namespace, &claims.kubernetes.serviceaccount.name) {
            return Err(TokenError::Malformed);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding {
            namespace: "shop".into(),
            pod: Ref { name: "web-1".into(), uid: "p-1".into() },
            serviceaccount: Ref { name: "reader".into(), uid: "s-1".into() },
            node: Some(Ref { name: "n1".into(), uid: "n-1".into() }),
        }
    }

    #[test]
    fn claims_are_kubernetes_bound_token_claims() {
        let claims = Claims::new(binding(), vec![ISSUER.into()], 1_000, 3607);
        let json = serde_json::to_value(&claims).unwrap();
        assert_eq!(json["sub"], "system:serviceaccount:shop:reader");
        assert_eq!(
            (json["iat"].as_i64(), json["nbf"].as_i64(), json["exp"].as_i64()),
            (Some(1_000), Some(1_000), Some(4_607))
        );
        assert_eq!(json["kubernetes.io"]["pod"], serde_json::json!({"name": "web-1", "uid": "p-1"}));
        assert_eq!(json["kubernetes.io"]["serviceaccount"]["uid"], "s-1");
        assert_eq!(json["aud"], serde_json::json!([ISSUER]));
    }

    #[test]
    fn tokens_verify_only_as_issued() {
        let key = SigningKey::from_pkcs8(&SigningKey::generate_pkcs8().unwrap()).unwrap();
        let other = SigningKey::from_pkcs8(&SigningKey::generate_pkcs8().unwrap()).unwrap();
        let keys = VerifyingKeys::new([key.public_key()]);
        let token = key.sign(&Claims::new(binding(), vec![ISSUER.into()], 1_000, 600)).unwrap();
        assert!(VerifyingKeys::looks_like_jwt(&token));
        assert!(!VerifyingKeys::looks_like_jwt("0123456789abcdef0123456789abcdef"));
        let foreign = other.sign(&Claims::new(binding(), vec![ISSUER.into()], 1_000, 600)).unwrap();
        let elsewhere = key.sign(&Claims::new(binding(), vec!["vault".into()], 1_000, 600)).unwrap();
        let mut issuer = Claims::new(binding(), vec![ISSUER.into()], 1_000, 600);
        issuer.iss = "https://elsewhere".into();
        let issuer = key.sign(&issuer).unwrap();
        let (head, rest) = token.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let forged_claims = Claims::new(binding(), vec![ISSUER.into()], 1_000, 1_000_000);
        let forged =
            format!("{head}.{}.{signature}", URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged_claims).unwrap()));
        let cases: Vec<(&str, &str, i64, Result<&str, TokenError>)> = vec![
            ("valid", &token, 1_100, Ok("system:serviceaccount:shop:reader")),
            ("within the leeway after expiry", &token, 1_650, Ok("system:serviceaccount:shop:reader")),
            ("expired", &token, 1_700, Err(TokenError::Expired)),
            ("before nbf", &token, 900, Err(TokenError::NotYetValid)),
            ("another cluster's key", &foreign, 1_100, Err(TokenError::Signature)),
            ("another audience", &elsewhere, 1_100, Err(TokenError::Audience)),
            ("another issuer", &issuer, 1_100, Err(TokenError::Issuer("https://elsewhere".into()))),
            ("claims changed after signing", &forged, 1_100, Err(TokenError::Signature)),
            ("not a JWT", "a.b", 1_100, Err(TokenError::Malformed)),
            ("garbage", "eyJ!.x.y", 1_100, Err(TokenError::Malformed)),
        ];
        for (name, token, now, want) in cases {
            let got = keys.verify(token, ISSUER, now).map(|c| c.sub);
            assert_eq!(got.as_deref().map_err(Clone::clone), want, "{name}");
        }
    }
}
