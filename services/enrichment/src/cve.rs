//! The CVE sources (issue 11, item 3), each an [`Enricher`] chosen by `PALISADE_CVE_SOURCE`:
//!
//! - `nvd` (the default): the local CVE table, kept current by an incremental sync from the
//!   NVD CVE API 2.0 (`lastModStartDate`/`lastModEndDate` windows of at most 120 days, at most
//!   once per sync interval, by one job at a time), with the ids it lacks looked up by id;
//! - `local`: the local CVE table only, filled by `palisade cve import` (sites without
//!   internet); an id it lacks is recorded `missing`;
//! - `none`: records the job's CVE ids and writes nothing ([`crate::RecordOnly`]).
//!
//! A job's steps, each checkpointed (fenced) before the next, so a job resumed after a crash
//! fetches no page it had already written: `start` (take the sync when it is due), `sync` (one
//! page of the window), `lookup` (up to [`LOOKUP_BATCH`] missing ids by id), `write` (every
//! CVE finding of the scan gets its CVE data, in one statement). Every write names the
//! job's claim and changes nothing once a newer claim holds it.
//!
//! What upstream sends cannot stop a job (issue 26): a record PostgreSQL could not store as
//! served is stored sanitised and one palisade cannot read is set aside, both recorded in
//! `cve_quarantine` (logged once per record, counted on `/metrics`, listed by `palisade cve
//! status`); one sync fetches at most `PALISADE_NVD_SYNC_MAX_PAGES` pages; and a window whose
//! `totalResults` changes while it is paged is read again from its first page, because NVD
//! pages by position: a record modified meanwhile leaves the window (its new `lastModified` is
//! past the window's end) and every later record moves one place forward, so the record that
//! moved across a page boundary already fetched would be skipped. Records can only leave a
//! window being paged, never enter it (its end is in the past), so an unchanged total means no
//! record moved.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use messages::v1;
use runtime::{SettingsError, env};
use serde::{Deserialize, Serialize};
use store::PgPool;
use store::cves::{
    CveOrigin, CveRecord, FindingsWritten, JobFence, QuarantineAction, Quarantined, Written,
};

use crate::nvd::{self, Nvd, NvdError, NvdSettings, Query};
use crate::{Enricher, JobInput, Step, StepError, metrics};

/// Missing ids looked up by id per step.
pub const LOOKUP_BATCH: usize = 8;
/// Each sync window starts this much before the watermark: a CVE NVD modified just before
/// the last window closed, but published to the API after, is not missed.
const SYNC_OVERLAP: chrono::TimeDelta = chrono::TimeDelta::hours(1);
/// A window whose total keeps changing is read again at most this many times; then the sync
/// pages on, but the watermark stays at that window's start ([`SyncProgress::unsettled`]), so
/// the next sync reads it again: a record that moved across a page boundary is never skipped
/// for good.
const MAX_WINDOW_REREADS: u32 = 3;

/// Which source enriches jobs (`PALISADE_CVE_SOURCE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CveSource {
    Nvd,
    Local,
    None,
}

impl std::str::FromStr for CveSource {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "nvd" => Ok(CveSource::Nvd),
            "local" => Ok(CveSource::Local),
            "none" => Ok(CveSource::None),
            _ => Err("must be nvd, local or none".into()),
        }
    }
}

impl CveSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CveSource::Nvd => "nvd",
            CveSource::Local => "local",
            CveSource::None => "none",
        }
    }
}

/// The CVE source's settings.
#[derive(Debug, Clone)]
pub struct CveSettings {
    pub source: CveSource,
    pub nvd: NvdSettings,
    /// How often the local table is synced from NVD (`PALISADE_NVD_SYNC_INTERVAL_MS`, default
    /// 7200000: NVD asks for no more than once every two hours; `0`: never, lookups by id only).
    pub sync_interval: Option<Duration>,
    /// Where the first sync of a never-synced table starts (`PALISADE_NVD_SYNC_FROM`, an
    /// RFC 3339 instant); unset: at that first sync, so nothing older is fetched except by id.
    pub sync_from: Option<DateTime<Utc>>,
    /// An id NVD did not know is looked up again after this (`PALISADE_NVD_UNKNOWN_RECHECK_MS`,
    /// default 86400000); the sync brings it sooner once NVD publishes it.
    pub recheck_unknown_after: Duration,
    /// Pages one sync fetches at most (`PALISADE_NVD_SYNC_MAX_PAGES`, default 500: a million
    /// records at NVD's page size, more than all of NVD). A sync that reaches it stops with the
    /// watermark at the window it was paging, and the next sync goes on from there.
    pub sync_max_pages: u64,
}

impl CveSettings {
    pub fn from_env() -> Result<Self, SettingsError> {
        let sync_interval = env::parse("PALISADE_NVD_SYNC_INTERVAL_MS", 7_200_000_u64)?;
        let sync_from = env::optional_string("PALISADE_NVD_SYNC_FROM")
            .map(|text| {
                DateTime::parse_from_rfc3339(text.trim())
                    .map(|at| at.to_utc())
                    .map_err(|error| SettingsError::Invalid {
                        name: "PALISADE_NVD_SYNC_FROM",
                        value: text.clone(),
                        reason: format!(
                            "{error}: an RFC 3339 instant such as 2024-01-01T00:00:00Z"
                        ),
                    })
            })
            .transpose()?;
        Ok(Self {
            source: env::parse("PALISADE_CVE_SOURCE", CveSource::Nvd)?,
            nvd: NvdSettings::from_env()?,
            sync_interval: (sync_interval > 0).then(|| Duration::from_millis(sync_interval)),
            sync_from,
            recheck_unknown_after: Duration::from_millis(env::parse(
                "PALISADE_NVD_UNKNOWN_RECHECK_MS",
                86_400_000_u64,
            )?),
            sync_max_pages: env::parse_in("PALISADE_NVD_SYNC_MAX_PAGES", 500_u64, 1..=1_000_000)?,
        })
    }

    /// The enricher these settings choose.
    pub fn enricher(&self, pool: &PgPool) -> anyhow::Result<Arc<dyn Enricher>> {
        Ok(match self.source {
            CveSource::None => Arc::new(crate::RecordOnly),
            CveSource::Local => Arc::new(CveEnricher {
                pool: pool.clone(),
                nvd: None,
                settings: self.clone(),
            }),
            CveSource::Nvd => Arc::new(CveEnricher {
                pool: pool.clone(),
                nvd: Some(Nvd::new(self.nvd.clone(), pool.clone())?),
                settings: self.clone(),
            }),
        })
    }
}

/// Enriches jobs from the local CVE table, synced from and completed by NVD when `nvd` is set.
pub struct CveEnricher {
    pool: PgPool,
    nvd: Option<Nvd>,
    settings: CveSettings,
}

/// Where a job stands: its checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub phase: Phase,
    /// The sync this job holds, while in `sync`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncProgress>,
    /// CVE rows this job wrote (sync and lookups): rows already holding the same record are
    /// not written again.
    #[serde(default)]
    pub written: u64,
    /// Ids this job looked up by id.
    #[serde(default)]
    pub looked_up: u64,
    /// Records this job stored sanitised or set aside (`cve_quarantine`).
    #[serde(default)]
    pub quarantined: u64,
    /// The sync stopped at `PALISADE_NVD_SYNC_MAX_PAGES`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sync_capped: bool,
    /// A window of the sync kept changing while paged: the watermark stayed at its start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sync_unsettled: bool,
    /// Once done: the CVE findings of the scan, and how many changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings_written: Option<u64>,
    /// Once done: the source and the scan's CVE ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cve_ids: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Start,
    Sync,
    Lookup,
    Write,
    Done,
}

/// A sync in progress: the window `[window_start, min(window_start + 120 days, until)]`, its
/// next page at `start_index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncProgress {
    pub until: DateTime<Utc>,
    pub window_start: DateTime<Utc>,
    pub start_index: u64,
    /// Pages fetched by this sync so far.
    #[serde(default)]
    pub pages: u64,
    /// `totalResults` of the window's first page, to see the window change while paged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_total: Option<u64>,
    /// Times this window was read again from its first page.
    #[serde(default)]
    pub rereads: u32,
    /// The start of the first window that still changed after [`MAX_WINDOW_REREADS`]: the
    /// watermark moves no further than this, so the next sync reads it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsettled: Option<DateTime<Utc>>,
}

impl SyncProgress {
    fn window_end(&self) -> DateTime<Utc> {
        (self.window_start + chrono::TimeDelta::days(nvd::MAX_WINDOW_DAYS)).min(self.until)
    }
}

impl Enricher for CveEnricher {
    fn step<'a>(
        &'a self,
        job: &'a JobInput,
        checkpoint: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Step, StepError>> {
        Box::pin(async move {
            // A checkpoint of another shape (another source's) starts the job over: every
            // step is idempotent.
            let progress: Progress = serde_json::from_value(checkpoint.clone()).unwrap_or_default();
            self.advance(job, progress).await
        })
    }
}

impl CveEnricher {
    async fn advance(&self, job: &JobInput, mut progress: Progress) -> Result<Step, StepError> {
        let fence = job.fence;
        // Phases that fetch nothing run on within the step; a checkpoint is written before
        // each that fetches from NVD.
        loop {
            let then = match progress.phase {
                Phase::Start => self.start(job, &mut progress).await?,
                Phase::Sync => {
                    let (Some(nvd), Some(sync)) = (&self.nvd, progress.sync.take()) else {
                        progress.phase = Phase::Lookup;
                        continue;
                    };
                    return self.sync_page(nvd, fence, sync, progress).await;
                }
                Phase::Lookup => {
                    let Some(nvd) = &self.nvd else {
                        progress.phase = Phase::Write;
                        continue;
                    };
                    self.lookup(nvd, job, &mut progress).await?
                }
                Phase::Write | Phase::Done => return self.write_findings(job, progress).await,
            };
            match then {
                ControlFlow::Continue(phase) => progress.phase = phase,
                ControlFlow::Break(step) => return Ok(step),
            }
        }
    }

    /// The `start` phase: counts the job's lookups, then takes the sync when it is due
    /// (checkpointed before its first page), or goes on to the lookups or the write.
    async fn start(
        &self,
        job: &JobInput,
        progress: &mut Progress,
    ) -> Result<ControlFlow<Step, Phase>, StepError> {
        if job.cve_ids.is_empty() {
            let done = self.summary(job, std::mem::take(progress), 0, 0);
            return Ok(ControlFlow::Break(Step::Done(done)));
        }
        let misses = self.misses(job).await?;
        let valid = job
            .cve_ids
            .iter()
            .filter(|id| store::cves::is_cve_id(id))
            .count() as u64;
        let missed = misses.len() as u64;
        metrics::lookups(valid.saturating_sub(missed), missed);
        if self.nvd.is_none() {
            Ok(ControlFlow::Continue(Phase::Write))
        } else if let Some(interval) = self.settings.sync_interval
            && let Some(sync) = self.begin_sync(job.fence, interval).await?
        {
            progress.sync = Some(sync);
            progress.phase = Phase::Sync;
            Ok(ControlFlow::Break(Step::Progress(to_value(progress))))
        } else if misses.is_empty() {
            Ok(ControlFlow::Continue(Phase::Write))
        } else {
            progress.phase = Phase::Lookup;
            Ok(ControlFlow::Break(Step::Progress(to_value(progress))))
        }
    }

    /// The `lookup` phase: up to [`LOOKUP_BATCH`] missing ids looked up by id and written, or
    /// on to the write when none is missing.
    async fn lookup(
        &self,
        nvd: &Nvd,
        job: &JobInput,
        progress: &mut Progress,
    ) -> Result<ControlFlow<Step, Phase>, StepError> {
        let misses = self.misses(job).await?;
        if misses.is_empty() {
            return Ok(ControlFlow::Continue(Phase::Write));
        }
        let mut records = Vec::new();
        let mut quarantined = Vec::new();
        for id in misses.iter().take(LOOKUP_BATCH) {
            let mut page = nvd
                .page(&Query::Id(id.clone()), 0)
                .await
                .map_err(nvd_failure)?;
            page.locate(&format!("the NVD answer for {id}"));
            let found = page.records.into_iter().find(|record| record.id == *id);
            let mut set_aside = false;
            for mut entry in page.quarantined {
                if entry.action == QuarantineAction::SetAside
                    && found.is_none()
                    && entry.cve_id.as_ref().is_none_or(|named| named == id)
                {
                    // The answer for `id` holds a record palisade cannot read, even its id:
                    // NVD knows it, so it is set aside as `id` (its findings say `missing`,
                    // and it is not asked for again until the recheck), never `unknown`.
                    set_aside = true;
                    entry.key.clone_from(id);
                    entry.cve_id = Some(id.clone());
                }
                quarantined.push(entry);
            }
            if let Some(record) = found {
                records.push(record);
            } else if !set_aside {
                records.push(CveRecord::unknown(id));
            }
        }
        progress.looked_up += misses.len().min(LOOKUP_BATCH) as u64;
        match self.write(job.fence, &records).await? {
            Some(written) => progress.written += written,
            None => return Ok(ControlFlow::Break(Step::Lost)),
        }
        progress.quarantined += self.quarantine(&quarantined).await?;
        Ok(ControlFlow::Break(Step::Progress(to_value(progress))))
    }

    /// The `write` phase: every CVE finding of the scan gets its CVE data, and the job is done.
    async fn write_findings(&self, job: &JobInput, progress: Progress) -> Result<Step, StepError> {
        match store::cves::write_findings(&self.pool, job.fence)
            .await
            .map_err(store_failure)?
        {
            FindingsWritten::Fenced => Ok(Step::Lost),
            FindingsWritten::Written { findings, written } => {
                Ok(Step::Done(self.summary(job, progress, findings, written)))
            }
        }
    }

    /// One page of the sync's window written, and where the sync goes next.
    async fn sync_page(
        &self,
        nvd: &Nvd,
        fence: JobFence,
        mut sync: SyncProgress,
        mut progress: Progress,
    ) -> Result<Step, StepError> {
        if sync.pages >= self.settings.sync_max_pages {
            // Everything before this window is in the table; the next sync goes on from it.
            tracing::warn!(
                pages = sync.pages,
                window_start = %sync.window_start,
                "the NVD sync fetched PALISADE_NVD_SYNC_MAX_PAGES pages and stops; the next \
                 sync goes on from this window"
            );
            metrics::sync_capped();
            self.finish_sync(fence, sync.unsettled.unwrap_or(sync.window_start))
                .await?;
            progress.sync_capped = true;
            progress.sync_unsettled |= sync.unsettled.is_some();
            progress.phase = Phase::Lookup;
            return Ok(Step::Progress(to_value(&progress)));
        }
        let query = Query::Modified {
            start: sync.window_start,
            end: sync.window_end(),
        };
        let mut page = nvd
            .page(&query, sync.start_index)
            .await
            .map_err(nvd_failure)?;
        page.locate(&format!(
            "the NVD window {} to {}",
            nvd::format::api_date(sync.window_start),
            nvd::format::api_date(sync.window_end())
        ));
        match self.write(fence, &page.records).await? {
            Some(written) => progress.written += written,
            None => return Ok(Step::Lost),
        }
        progress.quarantined += self.quarantine(&page.quarantined).await?;
        sync.pages += 1;
        let goes_on = self.after_page(fence, &mut sync, &page).await?;
        progress.sync_unsettled |= sync.unsettled.is_some();
        if goes_on {
            progress.sync = Some(sync);
        } else {
            progress.phase = Phase::Lookup;
        }
        Ok(Step::Progress(to_value(&progress)))
    }

    /// Where the sync goes after `page`: the window again from its first page (its total
    /// changed while paged), its next page, the next window, or, after the last window,
    /// nowhere (`false`: the sync is finished and recorded).
    async fn after_page(
        &self,
        fence: JobFence,
        sync: &mut SyncProgress,
        page: &nvd::Page,
    ) -> Result<bool, StepError> {
        let next = sync.start_index + page.count;
        let moved = sync
            .window_total
            .is_some_and(|total| total != page.total_results);
        if sync.start_index == 0 || moved {
            sync.window_total = Some(page.total_results);
        }
        if moved && sync.rereads < MAX_WINDOW_REREADS {
            // Records left the window while it was paged: read it again from the start.
            tracing::info!(
                window_start = %sync.window_start,
                total = page.total_results,
                "the NVD window changed while paged; reading it again"
            );
            metrics::window_reread();
            sync.rereads += 1;
            sync.start_index = 0;
            return Ok(true);
        }
        if moved && sync.rereads == MAX_WINDOW_REREADS {
            unsettled(sync);
        }
        if page.count > 0 && next < page.total_results {
            sync.start_index = next;
            Ok(true)
        } else if page.count == 0 && sync.start_index < page.total_results {
            Err(StepError {
                error: v1::Error {
                    code: "nvd_unavailable".into(),
                    message: format!(
                        "the NVD API answered an empty page at startIndex {} of {} results",
                        sync.start_index, page.total_results
                    ),
                    ..Default::default()
                },
                retryable: true,
            })
        } else if sync.window_end() < sync.until {
            sync.window_start = sync.window_end();
            sync.start_index = 0;
            sync.window_total = None;
            sync.rereads = 0;
            Ok(true)
        } else {
            self.finish_sync(fence, sync.unsettled.unwrap_or(sync.until))
                .await?;
            Ok(false)
        }
    }

    async fn misses(&self, job: &JobInput) -> Result<Vec<String>, StepError> {
        store::cves::misses(
            &self.pool,
            &job.cve_ids,
            self.settings.recheck_unknown_after,
        )
        .await
        .map_err(store_failure)
    }

    /// The final checkpoint.
    fn summary(
        &self,
        job: &JobInput,
        mut progress: Progress,
        findings: u64,
        written: u64,
    ) -> serde_json::Value {
        progress.phase = Phase::Done;
        progress.findings = Some(findings);
        progress.findings_written = Some(written);
        progress.source = Some(self.settings.source.as_str().to_owned());
        progress.cve_ids = job.cve_ids.clone();
        to_value(&progress)
    }

    /// Takes the sync when it is due; the window to fetch, or `None` (not due, another job
    /// syncs, or nothing to fetch: a never-synced table without `PALISADE_NVD_SYNC_FROM`
    /// starts its watermark now).
    async fn begin_sync(
        &self,
        fence: JobFence,
        interval: Duration,
    ) -> Result<Option<SyncProgress>, StepError> {
        let Some(taken) =
            store::cves::take_sync(&self.pool, fence, store::cves::NVD_SYNC, interval)
                .await
                .map_err(store_failure)?
        else {
            return Ok(None);
        };
        let start = taken
            .synced_through
            .map(|through| through - SYNC_OVERLAP)
            .or(self.settings.sync_from);
        match start {
            Some(start) if start < taken.until => Ok(Some(SyncProgress {
                until: taken.until,
                window_start: start,
                start_index: 0,
                pages: 0,
                window_total: None,
                rereads: 0,
                unsettled: None,
            })),
            _ => {
                self.finish_sync(fence, taken.until).await?;
                Ok(None)
            }
        }
    }

    async fn finish_sync(&self, fence: JobFence, through: DateTime<Utc>) -> Result<(), StepError> {
        // Lost meanwhile: the next checkpoint finds it out.
        store::cves::finish_sync(&self.pool, fence, store::cves::NVD_SYNC, through)
            .await
            .map_err(store_failure)?;
        Ok(())
    }

    /// Writes CVE records, fenced; `None` when the job was lost.
    async fn write(
        &self,
        fence: JobFence,
        records: &[CveRecord],
    ) -> Result<Option<u64>, StepError> {
        if records.is_empty() {
            return Ok(Some(0));
        }
        match store::cves::upsert(&self.pool, Some(fence), CveOrigin::Nvd, records)
            .await
            .map_err(store_failure)?
        {
            Written::Rows(rows) => Ok(Some(rows)),
            Written::Fenced => Ok(None),
        }
    }
}

impl CveEnricher {
    /// Records quarantined records; logs each the first time it is seen. How many there were.
    async fn quarantine(&self, records: &[Quarantined]) -> Result<u64, StepError> {
        quarantine(&self.pool, CveOrigin::Nvd, records)
            .await
            .map_err(store_failure)
    }
}

/// Records quarantined records from `origin`, logging and counting those seen for the first
/// time; how many `records` there were.
pub async fn quarantine(
    pool: &PgPool,
    origin: CveOrigin,
    records: &[Quarantined],
) -> Result<u64, store::StoreError> {
    for record in store::cves::quarantine(pool, origin, records).await? {
        tracing::warn!(
            record = %record.key,
            action = record.action.as_str(),
            reason = %record.reason,
            source = origin.as_str(),
            "a CVE record could not be kept as served; see palisade cve status"
        );
        metrics::quarantined(record.action);
    }
    Ok(records.len() as u64)
}

/// The window of `sync` still changed after [`MAX_WINDOW_REREADS`]: said once (WARN and
/// `palisade_nvd_windows_unsettled_total`), and the watermark kept at its start.
fn unsettled(sync: &mut SyncProgress) {
    tracing::warn!(
        window_start = %sync.window_start,
        window_end = %sync.window_end(),
        rereads = sync.rereads,
        "the NVD window kept changing while paged; the sync pages on, but the watermark stays \
         at the window's start so that the next sync reads it again"
    );
    metrics::window_unsettled();
    sync.rereads += 1;
    sync.unsettled.get_or_insert(sync.window_start);
}

fn to_value(progress: &Progress) -> serde_json::Value {
    serde_json::to_value(progress).expect("a Progress is plain data")
}

fn nvd_failure(error: NvdError) -> StepError {
    let code = match &error {
        NvdError::Unavailable { .. } => "nvd_unavailable",
        NvdError::Refused { .. } => "nvd_refused",
        NvdError::Limit(store) => return crate::store_failure(store),
    };
    StepError {
        retryable: matches!(error, NvdError::Unavailable { .. }),
        error: v1::Error {
            code: code.into(),
            message: error.to_string(),
            ..Default::default()
        },
    }
}

fn store_failure(error: store::StoreError) -> StepError {
    crate::store_failure(&error)
}
