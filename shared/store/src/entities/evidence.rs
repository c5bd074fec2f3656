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

/// The stable identity of an evaluation within a scan: plugin, rule and resource as the worker
/// sent them (before redaction), hashed as [`finding_key`] hashes them. A replay, or a later
/// message about the same rule and resource, updates the same row.
pub fn evaluation_key(plugin: &str, rule_id: &str, resource: &str) -> String {
    // The finding's hash with an empty discriminator: the two keys live in separate tables,
    // and a failure's finding without a discriminator shares its evaluation's key.
    finding_key(plugin, rule_id, resource, "")
}

/// What a redacted secret becomes.
pub const REDACTED: &str = "[REDACTED]";

/// Secrets recognised by their shape alone, in the order they are applied; each whole match
/// becomes [`REDACTED`]. docs/protocol/reference.md ("Redaction") lists them: keep it equal.
static SECRET_SHAPES: LazyLock<(regex::RegexSet, Vec<Regex>)> = LazyLock::new(|| {
    let patterns = [
        // PEM private keys (RSA, EC, OpenSSH, encrypted PKCS#8, …) and PGP private key blocks.
        r"-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----",
        // AWS access key ids.
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        // Google API keys.
        r"\bAIza[0-9A-Za-z_-]{35}\b",
        // GitHub tokens, classic and fine-grained.
        r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
        r"\bgithub_pat_[A-Za-z0-9_]{22,}\b",
        // GitLab tokens (personal, deploy, runner, …).
        r"\bgl(?:pat|dt|rt|ptt|ft|imt|oas|cbt|soat|agent)-[A-Za-z0-9_-]{20,}\b",
        // Slack tokens and webhooks, Discord webhooks, Telegram bot tokens.
        r"\bxox[abposre]-[A-Za-z0-9-]{10,}\b",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+",
        r"https://(?:canary\.|ptb\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]+",
        r"\b[0-9]{8,10}:AA[A-Za-z0-9_-]{33}\b",
        // Stripe, npm, PyPI, SendGrid and OpenAI-style API keys.
        r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b",
        r"\bnpm_[A-Za-z0-9]{36}\b",
        r"\bpypi-AgE[A-Za-z0-9_-]{50,}\b",
        r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}\b",
        r"\bsk-(?:proj-)?[A-Za-z0-9_-]{32,}\b",
        // Bearer and Basic credentials, the scheme word included.
        r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}",
        r"(?i)\bbasic\s+[A-Za-z0-9+/]{16,}={0,2}",
        // JWTs.
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b",
    ];
    // The set finds in one pass which shapes a text holds (usually none); only those are
    // then replaced, in order.
    (
        regex::RegexSet::new(patterns).expect("secret patterns compile"),
        patterns
            .iter()
            .map(|pattern| Regex::new(pattern).expect("secret pattern compiles"))
            .collect(),
    )
});

/// The password of a URL's user information (`scheme://user:password@host`): replaced, the
/// user kept.
static URL_PASSWORD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@").expect("URL pattern compiles")
});

/// `key = value` and `key: value` assignments, the key optionally quoted (a JSON member): the
/// value is redacted when the key names a secret ([`names_a_secret`]) or the value looks
/// random ([`looks_random`]).
static ASSIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?P<key>["']?\b[A-Za-z_][A-Za-z0-9_.-]*["']?)(?P<sep>[ \t]*[:=][ \t]*)(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s,;&"'<>]+)"#,
    )
    .expect("assignment pattern compiles")
});

/// Words that make a key a secret's name when they are its last word.
const SECRET_WORDS: [&str; 11] = [
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "credential",
    "credentials",
    "privatekey",
    "auth",
];

/// Words that make a final `key` a secret's name (`api_key`, `X-Api-Key`, `accessKey`, …).
const KEY_QUALIFIERS: [&str; 8] = [
    "api",
    "access",
    "secret",
    "private",
    "signing",
    "encryption",
    "master",
    "account",
];

/// Whether `key` names a secret: its last word (words are split at `_`, `.`, `-` and
/// lower-to-upper case changes) is one of [`SECRET_WORDS`], or is `key` after one of
/// [`KEY_QUALIFIERS`]. So `db.password`, `GITHUB_TOKEN`, `clientSecret`, `X-Api-Key` and
/// `aws_secret_access_key` name secrets; `secretary`, `tokenizer`, `token_count` and
/// `secret_name` do not.
pub fn names_a_secret(key: &str) -> bool {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut previous_lower = false;
    for c in key.trim_matches(|c| c == '"' || c == '\'').chars() {
        if matches!(c, '_' | '.' | '-') {
            words.push(std::mem::take(&mut word));
            previous_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && previous_lower {
            words.push(std::mem::take(&mut word));
        }
        previous_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        word.push(c.to_ascii_lowercase());
    }
    words.push(word);
    words.retain(|word| !word.is_empty());
    match words.as_slice() {
        [.., qualifier, last] if last == "key" => KEY_QUALIFIERS.contains(&qualifier.as_str()),
        [.., last] => SECRET_WORDS.contains(&last.as_str()),
        [] => false,
    }
}

/// Whether a value looks like a random credential: at least 24 characters of letters, digits
/// and `+/=_-`, with lower case, upper case and digits all present, not a hex string (digests,
/// commit ids) or a UUID, and at least 4 bits of Shannon entropy per character.
pub fn looks_random(value: &str) -> bool {
    let value = value.trim_matches(|c| c == '"' || c == '\'');
    if value.chars().count() < 24
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '_' | '-'))
    {
        return false;
    }
    let hex_or_uuid = value.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    let classes = [
        value.chars().any(|c| c.is_ascii_lowercase()),
        value.chars().any(|c| c.is_ascii_uppercase()),
        value.chars().any(|c| c.is_ascii_digit()),
    ];
    if hex_or_uuid || !classes.iter().all(|present| *present) {
        return false;
    }
    let mut counts = std::collections::HashMap::new();
    for c in value.chars() {
        *counts.entry(c).or_insert(0_usize) += 1;
    }
    let length = value.chars().count() as f64;
    let entropy: f64 = counts
        .values()
        .map(|&count| {
            let p = count as f64 / length;
            -p * p.log2()
        })
        .sum();
    entropy >= 4.0
}

/// `text` with secrets replaced by `[REDACTED]`, in three passes (docs/protocol/reference.md,
/// "Redaction"): assignments whose key names a secret or whose value looks random, passwords
/// in URLs, then the shapes of [`SECRET_SHAPES`]. It recognises patterns: it cannot promise
/// to find every secret.
pub fn redact(text: &str) -> String {
    let assigned = ASSIGNMENT.replace_all(text, |caps: &regex::Captures<'_>| {
        let (key, sep, value) = (&caps["key"], &caps["sep"], &caps["value"]);
        if !(names_a_secret(key) || looks_random(value)) || value == REDACTED {
            return caps[0].to_owned();
        }
        let quote = value
            .chars()
            .next()
            .filter(|c| (*c == '"' || *c == '\'') && value.len() > 1 && value.ends_with(*c));
        match quote {
            Some(quote) => format!("{key}{sep}{quote}{REDACTED}{quote}"),
            None => format!("{key}{sep}{REDACTED}"),
        }
    });
    let mut redacted = URL_PASSWORD
        .replace_all(&assigned, |caps: &regex::Captures<'_>| {
            format!("{}{REDACTED}@", &caps[1])
        })
        .into_owned();
    let (set, shapes) = &*SECRET_SHAPES;
    let held = set.matches(&redacted);
    if held.matched_any() {
        // A replacement can only remove text, so a shape the set did not find is not there.
        for index in held.iter() {
            redacted = shapes[index].replace_all(&redacted, REDACTED).into_owned();
        }
    }
    redacted
}

/// The redaction corpus (`testdata/redaction_corpus.tsv`): realistic secrets, each with a
/// text holding it, that [`redact`] must remove, and look-alikes it must leave as they are.
#[cfg(any(test, feature = "testing"))]
pub fn redaction_corpus() -> (Vec<(String, String)>, Vec<String>) {
    let (mut secrets, mut keep) = (Vec::new(), Vec::new());
    for line in include_str!("../../testdata/redaction_corpus.tsv").lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = line.splitn(3, '\t');
        let (kind, secret, text) = (
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default().replace("\\n", "\n"),
        );
        match kind {
            "secret" => secrets.push((secret.to_owned(), text)),
            "keep" => keep.push(text),
            other => panic!("redaction corpus: unknown kind {other:?} in {line:?}"),
        }
    }
    (secrets, keep)
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
        for (input, output) in DOCUMENTED_VECTORS {
            assert_eq!(redact(input), *output, "redact({input:?})");
        }
    }

    pub(super) const DOCUMENTED_VECTORS: &[(&str, &str)] = &[
        (
            "password=hunter2 Authorization: Bearer abcdefghijklmnopqrstuvwxyz",
            "password=[REDACTED] Authorization: [REDACTED]",
        ),
        (
            "db.password = \"s3cret pass\"; X-Api-Key: abc123 aws=AKIAABCDEFGHIJKLMNOP {\"token\": \"t0k\"}",
            "db.password = \"[REDACTED]\"; X-Api-Key: [REDACTED] aws=[REDACTED] {\"token\": \"[REDACTED]\"}",
        ),
        (
            "secretary: Bob, tokenizer=bert, token_count=5, PASSWD='a b'&next=1",
            "secretary: Bob, tokenizer=bert, token_count=5, PASSWD='[REDACTED]'&next=1",
        ),
        (
            "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nend",
            "key:\n[REDACTED]\nend",
        ),
        (
            "gh=ghp_abcdefghijklmnopqrstuvwxyz0123456789 slack=xoxb-1234567890-abc jwt=eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl",
            "gh=[REDACTED] slack=[REDACTED] jwt=[REDACTED]",
        ),
        (
            "postgres://app:Pa55w0rd@db:5432/x https://user@example.com/",
            "postgres://app:[REDACTED]@db:5432/x https://user@example.com/",
        ),
        (
            "SIGNING=q8Zr4TfX2mLp9WcV7nBy3KdH6sJe1uQa commit=5f3c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39",
            "SIGNING=[REDACTED] commit=5f3c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39",
        ),
    ];

    #[test]
    fn the_corpus_secrets_are_removed_and_its_look_alikes_kept() {
        let (secrets, keep) = redaction_corpus();
        assert!(secrets.len() >= 25 && keep.len() >= 15);
        for (secret, text) in &secrets {
            let redacted = redact(text);
            assert!(
                !redacted.contains(secret.as_str()),
                "{text:?} became {redacted:?}"
            );
            assert!(redacted.contains(REDACTED), "{redacted:?}");
            assert_eq!(
                redact(&redacted),
                redacted,
                "redacting again changes nothing"
            );
        }
        for text in &keep {
            assert_eq!(&redact(text), text, "a look-alike was changed");
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
