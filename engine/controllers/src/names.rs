//! Generated names, as the API server's `generateName` and the Deployment controller's
//! pod-template-hash make them.

use rand::Rng;

/// Kubernetes' safe alphabet: no vowels (no words), no easily confused characters.
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `base` plus five random characters: `web-7d9c5-x2k9f`.
pub fn generate(base: &str) -> String {
    let mut rng = rand::thread_rng();
    let suffix: String = (0..5).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char).collect();
    format!("{}-{suffix}", truncate(base, 58))
}

/// A stable short hash of some bytes in the safe alphabet (FNV-1a 64).
pub fn hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    let mut out = String::new();
    for _ in 0..10 {
        out.push(ALPHABET[(h % ALPHABET.len() as u64) as usize] as char);
        h /= ALPHABET.len() as u64;
    }
    out
}

/// At most `max` bytes, never ending in `-` or `.`.
pub fn truncate(name: &str, max: usize) -> &str {
    let cut = &name[..name.len().min(max)];
    cut.trim_end_matches(['-', '.'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_safe_and_hashes_stable() {
        let n = generate("web-abc");
        assert!(n.starts_with("web-abc-") && n.len() == 13, "{n}");
        assert_eq!(hash(b"template"), hash(b"template"));
        assert_ne!(hash(b"template"), hash(b"template2"));
        assert_eq!(truncate("a-b-", 4), "a-b");
    }
}
