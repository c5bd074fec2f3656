//! The NVD CVE API 2.0 response format, which NVD's JSON 2.0 data feeds share: one page of
//! `vulnerabilities` with `startIndex`, `resultsPerPage` and `totalResults`. Only what palisade
//! keeps is read; a record without a CVE id's shape is skipped.
//!
//! One bad record never costs the page (issue 26): each vulnerability is read on its own, so
//! one palisade cannot read is set aside, and one PostgreSQL could not store as served (a NUL
//! in a string, a date out of range) is sanitised; both are returned as [`Quarantined`] for
//! the caller to record.

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::Digest as _;
use store::cves::{CveRecord, Cvss, QuarantineAction, Quarantined};

/// One page of CVEs.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub start_index: u64,
    pub total_results: u64,
    /// How many vulnerabilities the page held, the skipped and set-aside ones included: the
    /// next page starts this much further.
    pub count: u64,
    /// The records to store, sanitised ones included.
    pub records: Vec<CveRecord>,
    /// The records sanitised or set aside.
    pub quarantined: Vec<Quarantined>,
}

/// Why a body is not an NVD page.
#[derive(Debug, thiserror::Error)]
#[error("not an NVD CVE API 2.0 page: {0}")]
pub struct FormatError(#[from] serde_json::Error);

/// Parses an API response or a data feed file. A body that is not JSON only inside some of
/// its records (a bare `NaN`, an invalid escape) is read record by record, those records set
/// aside ([`split_records`]); a body that is not an NVD page even so is an error.
pub fn parse(body: &[u8]) -> Result<Page, FormatError> {
    match serde_json::from_slice::<Response>(body) {
        Ok(response) => Ok(read(
            response.start_index,
            response.total_results,
            response
                .vulnerabilities
                .iter()
                .map(|raw| raw.get().as_bytes()),
        )),
        Err(error) => {
            let split = (error.classify() == serde_json::error::Category::Syntax)
                .then(|| split_records(body))
                .flatten();
            let Some((envelope, records)) = split else {
                return Err(error.into());
            };
            let envelope: Response = serde_json::from_slice(&envelope)?;
            Ok(read(
                envelope.start_index,
                envelope.total_results,
                records.into_iter(),
            ))
        }
    }
}

impl Page {
    /// Says where the page came from (`the NVD window …`, a file's name) in each of its
    /// quarantined records' reasons, after their place on the page.
    pub fn locate(&mut self, place: &str) {
        for record in &mut self.quarantined {
            record.reason = format!("{place}: {}", record.reason);
        }
    }
}

/// Reads a page's records one by one: each readable one is kept (sanitised where it must
/// be), each other set aside with its place on the page.
fn read<'a>(
    start_index: u64,
    total_results: u64,
    vulnerabilities: impl ExactSizeIterator<Item = &'a [u8]>,
) -> Page {
    let count = vulnerabilities.len() as u64;
    let mut records = Vec::with_capacity(vulnerabilities.len());
    let mut quarantined = Vec::new();
    for (position, raw) in vulnerabilities.enumerate() {
        let place = format!(
            "record {} of {count} on the page at startIndex {start_index}",
            position + 1
        );
        match serde_json::from_slice::<Vulnerability>(raw) {
            Ok(vulnerability) => {
                if !store::cves::is_cve_id(&vulnerability.cve.id) {
                    continue;
                }
                let (mut record, mut dropped) = vulnerability.cve.record();
                dropped.extend(record.sanitise());
                if !dropped.is_empty() {
                    quarantined.push(Quarantined {
                        key: record.id.clone(),
                        cve_id: Some(record.id.clone()),
                        action: QuarantineAction::Sanitised,
                        reason: format!("{place}: {}", dropped.join("; ")),
                    });
                }
                records.push(record);
            }
            Err(error) => quarantined.push(set_aside(raw, &error, &place)),
        }
    }
    Page {
        start_index,
        total_results,
        count,
        records,
        quarantined,
    }
}

/// A vulnerability that could not be read: keyed by its CVE id when that much is readable,
/// else by the hash of its bytes, its reason saying where it was.
fn set_aside(raw: &[u8], error: &serde_json::Error, place: &str) -> Quarantined {
    #[derive(Deserialize)]
    struct Id {
        cve: IdOnly,
    }
    #[derive(Deserialize)]
    struct IdOnly {
        id: String,
    }
    let cve_id = serde_json::from_slice::<Id>(raw)
        .ok()
        .map(|id| id.cve.id)
        .or_else(|| first_id(raw))
        .filter(|id| store::cves::is_cve_id(id));
    let key = cve_id
        .clone()
        .unwrap_or_else(|| format!("sha256:{}", hex::encode(sha2::Sha256::digest(raw))));
    Quarantined {
        key,
        cve_id,
        action: QuarantineAction::SetAside,
        reason: format!("{place}: unreadable: {error}"),
    }
}

/// The first `"id": "…"` of a record that is not JSON, as NVD writes `cve.id` first: enough
/// to name the record set aside (it must still have a CVE id's shape).
fn first_id(raw: &[u8]) -> Option<String> {
    let key = b"\"id\"";
    let at = raw.windows(key.len()).position(|window| window == key)? + key.len();
    let at = skip_space(raw, at);
    if raw.get(at) != Some(&b':') {
        return None;
    }
    let start = skip_space(raw, at + 1);
    if raw.get(start) != Some(&b'"') {
        return None;
    }
    let end = string_end(raw, start)?;
    String::from_utf8(raw[start + 1..end - 1].to_vec()).ok()
}

/// A body serde could not read as a whole, split by its brackets: the page's other fields as
/// a JSON object of their own, and each element of `vulnerabilities` as its own bytes, valid
/// or not. A record that is not JSON at all (a bare `NaN`, an invalid escape such as `\q`)
/// then costs only itself. `None` when the body does not hold together even so (cut short,
/// unbalanced), which is not a page.
fn split_records(body: &[u8]) -> Option<(Vec<u8>, Vec<&[u8]>)> {
    let mut at = skip_space(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    let mut envelope = b"{".to_vec();
    let mut records = Vec::new();
    at = skip_space(body, at + 1);
    if body.get(at) == Some(&b'}') {
        return None;
    }
    loop {
        if body.get(at) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(body, at)?;
        let key = &body[at..key_end];
        at = skip_space(body, key_end);
        if body.get(at) != Some(&b':') {
            return None;
        }
        at = skip_space(body, at + 1);
        if key == b"\"vulnerabilities\"" && body.get(at) == Some(&b'[') {
            at = skip_space(body, at + 1);
            while body.get(at) != Some(&b']') {
                let end = value_end(body, at)?;
                records.push(body[at..end].trim_ascii());
                at = end;
                match body.get(at) {
                    Some(b',') => at = skip_space(body, at + 1),
                    Some(b']') => {}
                    _ => return None,
                }
            }
            at = skip_space(body, at + 1);
        } else {
            let end = value_end(body, at)?;
            if envelope.len() > 1 {
                envelope.push(b',');
            }
            envelope.extend_from_slice(key);
            envelope.push(b':');
            envelope.extend_from_slice(body[at..end].trim_ascii());
            at = end;
        }
        match body.get(at) {
            Some(b',') => at = skip_space(body, at + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    envelope.push(b'}');
    (skip_space(body, at + 1) == body.len()).then_some((envelope, records))
}

/// Where the value starting at `at` ends: the first `,` or closing bracket outside a string
/// and outside the brackets it opened. `None` when the body ends first.
fn value_end(body: &[u8], mut at: usize) -> Option<usize> {
    let mut depth = 0_usize;
    while let Some(&byte) = body.get(at) {
        match byte {
            b'"' => {
                at = string_end(body, at)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' | b',' if depth == 0 => return Some(at),
            b'}' | b']' => depth -= 1,
            _ => {}
        }
        at += 1;
    }
    None
}

/// Where the string whose opening quote is at `at` ends (after its closing quote), whatever
/// its escapes say; `None` when the body ends first.
fn string_end(body: &[u8], mut at: usize) -> Option<usize> {
    at += 1;
    loop {
        match body.get(at)? {
            b'\\' => at += 2,
            b'"' => return Some(at + 1),
            _ => at += 1,
        }
    }
}

fn skip_space(body: &[u8], at: usize) -> usize {
    at + body[at.min(body.len())..]
        .iter()
        .take_while(|byte| byte.is_ascii_whitespace())
        .count()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    start_index: u64,
    total_results: u64,
    #[serde(default)]
    vulnerabilities: Vec<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
struct Vulnerability {
    cve: Cve,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cve {
    id: String,
    published: Option<String>,
    last_modified: Option<String>,
    #[serde(default)]
    vuln_status: String,
    #[serde(default)]
    descriptions: Vec<LangString>,
    #[serde(default)]
    metrics: Metrics,
    #[serde(default)]
    weaknesses: Vec<Weakness>,
    #[serde(default)]
    references: Vec<Reference>,
}

#[derive(Debug, Deserialize)]
struct LangString {
    lang: String,
    value: String,
}

#[derive(Debug, Default, Deserialize)]
struct Metrics {
    #[serde(default, rename = "cvssMetricV31")]
    v31: Vec<Metric>,
    #[serde(default, rename = "cvssMetricV40")]
    v40: Vec<Metric>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metric {
    #[serde(default, rename = "type")]
    kind: String,
    cvss_data: CvssData,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CvssData {
    vector_string: String,
    base_score: f64,
    #[serde(default)]
    base_severity: String,
}

#[derive(Debug, Deserialize)]
struct Weakness {
    #[serde(default)]
    description: Vec<LangString>,
}

#[derive(Debug, Deserialize)]
struct Reference {
    url: String,
}

impl Cve {
    /// The record palisade keeps, and what of the served record it could not keep (a score
    /// outside 0–10, a date it cannot read), each said for the quarantine.
    fn record(self) -> (CveRecord, Vec<String>) {
        let mut dropped = Vec::new();
        let description = self
            .descriptions
            .iter()
            .find(|text| text.lang == "en")
            .map(|text| text.value.clone())
            .unwrap_or_default();
        let mut cwe_ids: Vec<String> = Vec::new();
        for value in self
            .weaknesses
            .iter()
            .flat_map(|weakness| &weakness.description)
            .map(|text| text.value.as_str())
        {
            // NVD also says `NVD-CWE-Other` and `NVD-CWE-noinfo`: not CWE ids.
            let is_cwe = value.strip_prefix("CWE-").is_some_and(|number| {
                !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())
            });
            if is_cwe && !cwe_ids.iter().any(|kept| kept == value) {
                cwe_ids.push(value.to_owned());
            }
        }
        let mut date = |name: &str, text: Option<&str>| {
            let text = text?;
            let at = timestamp(text);
            if at.is_none() {
                dropped.push(format!("{name} {text:?} is not a date, dropped"));
            }
            at
        };
        let published = date("published", self.published.as_deref());
        let last_modified = date("lastModified", self.last_modified.as_deref());
        let cvss_v31 = primary("cvssMetricV31", &self.metrics.v31, &mut dropped);
        let cvss_v40 = primary("cvssMetricV40", &self.metrics.v40, &mut dropped);
        let record = CveRecord {
            known: true,
            published,
            last_modified,
            vuln_status: self.vuln_status,
            description,
            cvss_v31,
            cvss_v40,
            cwe_ids,
            references: self
                .references
                .into_iter()
                .map(|reference| reference.url)
                .collect(),
            id: self.id,
        };
        (record, dropped)
    }
}

/// The primary metric (NVD's own), else the first; one whose score is outside 0..=10 is not
/// kept, and said in `dropped`.
fn primary(name: &str, metrics: &[Metric], dropped: &mut Vec<String>) -> Option<Cvss> {
    let metric = metrics
        .iter()
        .find(|metric| metric.kind == "Primary")
        .or_else(|| metrics.first())?;
    let score = metric.cvss_data.base_score;
    if !(0.0..=10.0).contains(&score) {
        dropped.push(format!("{name} baseScore {score} is outside 0-10, dropped"));
        return None;
    }
    Some(Cvss {
        score,
        severity: metric.cvss_data.base_severity.clone(),
        vector: metric.cvss_data.vector_string.clone(),
    })
}

/// NVD's timestamps are UTC without an offset (`2021-12-10T10:15:09.143`); an offset is
/// accepted too.
fn timestamp(text: &str) -> Option<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
        .map(|naive| naive.and_utc())
        .ok()
        .or_else(|| {
            DateTime::parse_from_rfc3339(text)
                .ok()
                .map(|at| at.with_timezone(&Utc))
        })
}

/// Formats an instant as the API's date parameters take it.
pub fn api_date(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.3f+00:00").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"{
      "resultsPerPage": 2, "startIndex": 4, "totalResults": 7, "format": "NVD_CVE",
      "version": "2.0", "timestamp": "2024-01-01T00:00:00.000",
      "vulnerabilities": [
        {"cve": {"id": "CVE-2021-44228", "published": "2021-12-10T10:15:09.143",
          "lastModified": "2024-04-03T17:35:15.857", "vulnStatus": "Analyzed",
          "descriptions": [{"lang": "es", "value": "no"}, {"lang": "en", "value": "Log4Shell"}],
          "metrics": {
            "cvssMetricV31": [
              {"source": "other", "type": "Secondary", "cvssData": {"version": "3.1",
                "vectorString": "CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:L/I:L/A:L", "baseScore": 5.6,
                "baseSeverity": "MEDIUM"}},
              {"source": "nvd@nist.gov", "type": "Primary", "cvssData": {"version": "3.1",
                "vectorString": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", "baseScore": 10.0,
                "baseSeverity": "CRITICAL"}}],
            "cvssMetricV40": [{"source": "x", "type": "Secondary", "cvssData": {"version": "4.0",
                "vectorString": "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N",
                "baseScore": 9.3, "baseSeverity": "CRITICAL"}}]},
          "weaknesses": [
            {"source": "nvd@nist.gov", "type": "Primary", "description": [
              {"lang": "en", "value": "CWE-917"}, {"lang": "en", "value": "NVD-CWE-Other"}]},
            {"source": "x", "type": "Secondary", "description": [
              {"lang": "en", "value": "CWE-502"}, {"lang": "en", "value": "CWE-917"}]}],
          "references": [{"url": "https://logging.apache.org/log4j/2.x/security.html"}]}},
        {"cve": {"id": "not-a-cve"}}
      ]
    }"#;

    #[test]
    fn a_page_gives_its_records_with_the_primary_metrics_and_cwe_ids() {
        let page = parse(PAGE.as_bytes()).unwrap();
        assert_eq!(
            (page.start_index, page.total_results, page.count),
            (4, 7, 2)
        );
        assert_eq!(
            page.records.len(),
            1,
            "the id without a CVE id's shape is skipped"
        );
        let record = &page.records[0];
        assert_eq!(record.id, "CVE-2021-44228");
        assert_eq!(record.description, "Log4Shell");
        let v31 = record.cvss_v31.as_ref().unwrap();
        assert_eq!((v31.score, v31.severity.as_str()), (10.0, "CRITICAL"));
        assert!(v31.vector.starts_with("CVSS:3.1/AV:N/AC:L"));
        assert_eq!(record.cvss_v40.as_ref().unwrap().score, 9.3);
        assert_eq!(record.cwe_ids, ["CWE-917", "CWE-502"]);
        assert_eq!(
            record.published.unwrap().to_rfc3339(),
            "2021-12-10T10:15:09.143+00:00"
        );
        assert_eq!(record.references.len(), 1);
    }

    #[test]
    fn a_truncated_body_is_not_a_page() {
        assert!(parse(&PAGE.as_bytes()[..PAGE.len() / 2]).is_err());
        assert!(parse(b"<html>busy</html>").is_err());
    }

    /// Issue 26: a NUL in a description (valid JSON, refused by PostgreSQL), a record of the
    /// wrong shape and a lone surrogate cost their own record only, each reported once.
    #[test]
    fn one_bad_record_is_quarantined_and_the_rest_of_the_page_kept() {
        let body = r#"{"startIndex": 0, "totalResults": 5, "vulnerabilities": [
            {"cve": {"id": "CVE-2024-0001", "descriptions": [{"lang": "en", "value": "a\u0000b"}],
              "references": [{"url": "https://x/\u0000"}], "published": "-200000-01-01T00:00:00"}},
            {"cve": {"id": "CVE-2024-0002", "metrics": {"cvssMetricV31": [
              {"type": "Primary", "cvssData": {"baseScore": "high", "vectorString": "x"}}]}}},
            {"cve": {"id": "CVE-2024-0003", "descriptions": [{"lang": "en", "value": "\ud800"}]}},
            {"cve": {"no id": true}},
            {"cve": {"id": "CVE-2024-0005", "descriptions": [{"lang": "en", "value": "fine"}]}}
        ]}"#;
        let page = parse(body.as_bytes()).unwrap();
        assert_eq!(page.count, 5, "the next page starts after all five");
        let ids: Vec<&str> = page.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["CVE-2024-0001", "CVE-2024-0005"]);
        assert_eq!(page.records[0].description, "a\u{FFFD}b");
        assert_eq!(page.records[0].references, ["https://x/\u{FFFD}"]);
        let quarantined: Vec<(&str, QuarantineAction)> = page
            .quarantined
            .iter()
            .map(|q| (q.key.as_str(), q.action))
            .collect();
        assert_eq!(
            quarantined[..3],
            [
                ("CVE-2024-0001", QuarantineAction::Sanitised),
                ("CVE-2024-0002", QuarantineAction::SetAside),
                ("CVE-2024-0003", QuarantineAction::SetAside),
            ]
        );
        assert!(
            page.quarantined[0]
                .reason
                .contains("description, references"),
            "{:?}",
            page.quarantined[0]
        );
        assert!(quarantined[3].0.starts_with("sha256:"), "{quarantined:?}");
        assert_eq!(page.quarantined[3].cve_id, None);
        assert_eq!(page.quarantined.len(), 4);
    }

    /// Issue 48, item 1: a record that is not JSON at all (a bare `NaN` score, a `\q`
    /// escape) failed its whole page, and an import of its file; now it is set aside with its
    /// place on the page and the rest kept. A body cut short is still not a page.
    #[test]
    fn a_record_that_is_not_json_costs_itself_only() {
        let body = r#"{"startIndex": 40, "totalResults": 45, "vulnerabilities": [
            {"cve": {"id": "CVE-2024-0001"}},
            {"cve": {"id": "CVE-2024-0002", "metrics": {"cvssMetricV31": [
              {"type": "Primary", "cvssData": {"baseScore": NaN, "vectorString": "x"}}]}}},
            {"cve": {"descriptions": [{"lang": "en", "value": "a \q b"}]}},
            {"cve": {"id": "CVE-2024-0004", "descriptions": [{"lang": "en", "value": "[}\"{"}]}},
            {"cve": {"id": "CVE-2024-0005"}}
        ], "format": "NVD_CVE"}"#;
        assert!(serde_json::from_str::<serde_json::Value>(body).is_err());
        let page = parse(body.as_bytes()).unwrap();
        assert_eq!(
            (page.start_index, page.total_results, page.count),
            (40, 45, 5)
        );
        let ids: Vec<&str> = page.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["CVE-2024-0001", "CVE-2024-0004", "CVE-2024-0005"]);
        assert_eq!(page.records[1].description, "[}\"{");
        assert_eq!(page.quarantined.len(), 2, "{:?}", page.quarantined);
        assert_eq!(page.quarantined[0].key, "CVE-2024-0002");
        let unnamed = &page.quarantined[1];
        assert!(unnamed.key.starts_with("sha256:"), "{unnamed:?}");
        assert!(
            unnamed
                .reason
                .starts_with("record 3 of 5 on the page at startIndex 40: unreadable"),
            "{unnamed:?}"
        );
        for cut in [body.len() / 2, body.len() - 1, 30] {
            assert!(parse(&body.as_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        let mut located = parse(body.as_bytes()).unwrap();
        located.locate("nvdcve-2.0-2024.json");
        assert!(
            located.quarantined[1]
                .reason
                .starts_with("nvdcve-2.0-2024.json: record 3 of 5")
        );
    }

    /// Issue 48, item 3: a score outside 0–10 and a date palisade cannot read were dropped
    /// without a word; the record is kept without them and quarantined as sanitised, saying
    /// which.
    #[test]
    fn what_a_record_loses_is_quarantined_as_sanitised() {
        let body = r#"{"startIndex": 0, "totalResults": 2, "vulnerabilities": [
            {"cve": {"id": "CVE-2024-0001", "published": "yesterday", "metrics": {
              "cvssMetricV31": [{"type": "Primary", "cvssData": {"baseScore": 11.0,
                "vectorString": "x"}}],
              "cvssMetricV40": [{"type": "Primary", "cvssData": {"baseScore": 9.0,
                "vectorString": "y"}}]}}},
            {"cve": {"id": "CVE-2024-0002", "published": "2024-01-02T03:04:05.000"}}
        ]}"#;
        let page = parse(body.as_bytes()).unwrap();
        assert_eq!(page.records.len(), 2);
        let kept = &page.records[0];
        assert_eq!((kept.published, kept.cvss_v31.is_some()), (None, false));
        assert_eq!(kept.cvss_v40.as_ref().unwrap().score, 9.0);
        assert_eq!(page.quarantined.len(), 1, "{:?}", page.quarantined);
        let entry = &page.quarantined[0];
        assert_eq!(
            (entry.key.as_str(), entry.action),
            ("CVE-2024-0001", QuarantineAction::Sanitised)
        );
        assert_eq!(
            entry.reason,
            "record 1 of 2 on the page at startIndex 0: published \"yesterday\" is not a date, \
             dropped; cvssMetricV31 baseScore 11 is outside 0-10, dropped"
        );
    }

    #[test]
    fn api_dates_carry_their_offset() {
        let at = DateTime::parse_from_rfc3339("2024-01-02T03:04:05Z")
            .unwrap()
            .to_utc();
        assert_eq!(api_date(at), "2024-01-02T03:04:05.000+00:00");
    }
}
