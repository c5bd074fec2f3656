//! Evidence rules: stable finding keys and secret redaction before anything is stored.

use std::sync::LazyLock;

use regex::Regex;

/// The stable identity of a finding within a scan: sha256 over plugin, rule, resource scope
/// and discriminator, length-prefixed. Presentation fields (title, severity, text) are never
/// part of it, so a replay or re-run updates the same row instead of adding one.
pub fn finding_key(plugin: &str, rule_id: &str, resource: &str, discriminator: &str) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    for part in [plugin, rule_id, resource, discriminator] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

const REDACTED: &str = "[REDACTED]";

static SECRET_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        // PEM private keys, whole block.
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
        // AWS access key ids.
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        // GitHub, Slack and generic bearer tokens.
        r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
        r"\bxox[abpr]-[A-Za-z0-9-]{10,}\b",
        r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}",
        // JWTs.
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b",
    ]
    .iter()
    .map(|pattern| Regex::new(pattern).expect("secret pattern compiles"))
    .collect()
});

/// `key = value` / `key: value` assignments whose key names a secret: the value is redacted.
static SECRET_ASSIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)\b([A-Za-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)[A-Za-z0-9_.-]*)(\s*[:=]\s*)("[^"]*"|'[^']*'|[^\s,;&]+)"#)
        .expect("assignment pattern compiles")
});

/// `text` with known secret shapes replaced by `[REDACTED]`. Recognises patterns; it cannot
/// promise to find every secret.
pub fn redact(text: &str) -> String {
    let mut redacted = SECRET_ASSIGNMENT
        .replace_all(text, |caps: &regex::Captures<'_>| {
            format!("{}{}{REDACTED}", &caps[1], &caps[2])
        })
        .into_owned();
    for pattern in SECRET_PATTERNS.iter() {
        if pattern.is_match(&redacted) {
            redacted = pattern.replace_all(&redacted, REDACTED).into_owned();
        }
    }
    redacted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_key_ignores_presentation_and_separates_parts() {
        assert_eq!(
            finding_key("p", "r", "x", ""),
            finding_key("p", "r", "x", "")
        );
        assert_ne!(
            finding_key("p", "r", "x", ""),
            finding_key("p", "r", "x", "d")
        );
        assert_ne!(
            finding_key("p", "rx", "", ""),
            finding_key("p", "r", "x", "")
        );
    }

    #[test]
    fn redacts_known_secret_shapes() {
        let text = "aws=AKIAABCDEFGHIJKLMNOP password=hunter2 Authorization: Bearer abcdefghijklmnopqrstuvwxyz";
        let redacted = redact(text);
        assert!(!redacted.contains("AKIAABCDEFGHIJKLMNOP"), "{redacted}");
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(
            !redacted.contains("abcdefghijklmnopqrstuvwxyz"),
            "{redacted}"
        );
        assert!(redacted.contains("password=[REDACTED]"), "{redacted}");
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----";
        assert_eq!(redact(pem), REDACTED);
        assert_eq!(redact("nothing here"), "nothing here");
    }

    /// The redaction test vectors of docs/protocol/reference.md ("Test vectors"): keep them equal.
    #[test]
    fn documented_redaction_vectors() {
        for (input, output) in [
            (
                "password=hunter2 Authorization: Bearer abcdefghijklmnopqrstuvwxyz",
                "password=[REDACTED] Authorization: [REDACTED]",
            ),
            (
                "db.password = \"s3cret pass\"; X-Api-Key: abc123 aws=AKIAABCDEFGHIJKLMNOP Authorization: Bearer abcdefghijklmnopqrstuvwxyz {\"token\": \"t0k\"}",
                "db.password = [REDACTED]; X-Api-Key: [REDACTED] aws=[REDACTED] Authorization: [REDACTED] {\"token\": \"t0k\"}",
            ),
            (
                "secretary: Bob, PASSWD='a b'&next=1",
                "secretary: [REDACTED], PASSWD=[REDACTED]&next=1",
            ),
            (
                "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nend",
                "key:\n[REDACTED]\nend",
            ),
            (
                "gh=ghp_abcdefghijklmnopqrstuvwxyz0123456789 slack=xoxb-1234567890-abc jwt=eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl",
                "gh=[REDACTED] slack=[REDACTED] jwt=[REDACTED]",
            ),
        ] {
            assert_eq!(redact(input), output, "redact({input:?})");
        }
    }

    /// The `finding_key` test vector of docs/protocol/reference.md ("Test vectors").
    #[test]
    fn documented_finding_key_vector() {
        assert_eq!(
            finding_key("http_headers", "missing-hsts", "http://127.0.0.1:8080/", ""),
            "d18b46724d307d2119dc56b2719a1799b8bdd6a8461b63c001780e68bab1d550"
        );
    }
}
