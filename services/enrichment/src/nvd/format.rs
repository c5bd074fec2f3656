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

/// Parses an API response or a data feed file.
pub fn parse(body: &[u8]) -> Result<Page, FormatError> {
    let response: Response = serde_json::from_slice(body)?;
    let count = response.vulnerabilities.len() as u64;
    let mut records = Vec::with_capacity(response.vulnerabilities.len());
    let mut quarantined = Vec::new();
    for raw in &response.vulnerabilities {
        match serde_json::from_str::<Vulnerability>(raw.get()) {
            Ok(vulnerability) => {
                if !store::cves::is_cve_id(&vulnerability.cve.id) {
                    continue;
                }
                let mut record = vulnerability.cve.record();
                if let Some(reason) = record.sanitise() {
                    quarantined.push(Quarantined {
                        key: record.id.clone(),
                        cve_id: Some(record.id.clone()),
                        action: QuarantineAction::Sanitised,
                        reason,
                    });
                }
                records.push(record);
            }
            Err(error) => quarantined.push(set_aside(raw, &error)),
        }
    }
    Ok(Page {
        start_index: response.start_index,
        total_results: response.total_results,
        count,
        records,
        quarantined,
    })
}

/// A vulnerability that could not be read: keyed by its CVE id when that much is readable,
/// else by the hash of its JSON.
fn set_aside(raw: &RawValue, error: &serde_json::Error) -> Quarantined {
    #[derive(Deserialize)]
    struct Id {
        cve: IdOnly,
    }
    #[derive(Deserialize)]
    struct IdOnly {
        id: String,
    }
    let cve_id = serde_json::from_str::<Id>(raw.get())
        .ok()
        .map(|id| id.cve.id)
        .filter(|id| store::cves::is_cve_id(id));
    let key = cve_id.clone().unwrap_or_else(|| {
        format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(raw.get().as_bytes()))
        )
    });
    Quarantined {
        key,
        cve_id,
        action: QuarantineAction::SetAside,
        reason: format!("unreadable: {error}"),
    }
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
    fn record(self) -> CveRecord {
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
        CveRecord {
            known: true,
            published: self.published.as_deref().and_then(timestamp),
            last_modified: self.last_modified.as_deref().and_then(timestamp),
            vuln_status: self.vuln_status,
            description,
            cvss_v31: primary(&self.metrics.v31),
            cvss_v40: primary(&self.metrics.v40),
            cwe_ids,
            references: self
                .references
                .into_iter()
                .map(|reference| reference.url)
                .collect(),
            id: self.id,
        }
    }
}

/// The primary metric (NVD's own), else the first; a score outside 0..=10 is not kept.
fn primary(metrics: &[Metric]) -> Option<Cvss> {
    metrics
        .iter()
        .find(|metric| metric.kind == "Primary")
        .or_else(|| metrics.first())
        .filter(|metric| (0.0..=10.0).contains(&metric.cvss_data.base_score))
        .map(|metric| Cvss {
            score: metric.cvss_data.base_score,
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

    #[test]
    fn api_dates_carry_their_offset() {
        let at = DateTime::parse_from_rfc3339("2024-01-02T03:04:05Z")
            .unwrap()
            .to_utc();
        assert_eq!(api_date(at), "2024-01-02T03:04:05.000+00:00");
    }
}
