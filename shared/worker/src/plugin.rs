//! What a plugin is to the SDK: a named async function from a task to findings and assets
//! (pushed into a [`ResultSink`]) and a summary, or a [`PluginError`].

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use messages::v1;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{ArtifactUploader, UploadedArtifact};

/// One kind of scan. The worker advertises every plugin's [`Plugin::name`] as a capability and
/// runs the plugin a lease names.
///
/// `run` must return soon after `cancel` fires (the lease was lost, cancelled, timed out or
/// the worker is shutting down); whatever it returns then is ignored. It may run on several
/// tasks at once, so it keeps no per-task state in `self`.
pub trait Plugin: Send + Sync + 'static {
    /// The name tasks use to ask for this plugin, e.g. `"tcp_connect"`.
    fn name(&self) -> &'static str;

    /// The rules it checks, and on which resources: the worker declares them in its hello, and
    /// a scan job it completes requires an evaluation ([`ResultSink::evaluation`]) of each rule
    /// on each resource of those kinds the scan has. A plugin that declares none checks
    /// nothing a scan's coverage can show: its jobs' coverage reads unknown.
    fn rules(&self) -> &'static [Rule] {
        &[]
    }

    /// Scans `task.target`, pushing every finding and asset into `sink` as it is found, and
    /// returns a one-line summary for the scan job.
    fn run<'a>(
        &'a self,
        task: TaskInput,
        sink: ResultSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<String, PluginError>>;
}

/// A rule a plugin checks, and the kinds of resource it applies to: asset kinds (e.g.
/// `"http_service"`) and [`messages::TARGET_RESOURCE_KIND`] (`"target"`, the scan's target as
/// the request gave it, which is [`TaskInput::target`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// As the plugin's findings and evaluations name it.
    pub id: &'static str,
    pub applies_to: &'static [&'static str],
}

/// What a plugin gets to work on: the lease's target and the context of its scan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskInput {
    /// The plugin the task asked for (the one running).
    pub plugin: String,
    /// What to scan, as the scan request gave it: a URL, `host:port`, a path.
    pub target: String,
    /// Assets found by earlier plugins of the same scan.
    pub discovered_assets: Vec<v1::Asset>,
    pub scan_id: String,
    pub scan_job_id: String,
    pub organization_id: String,
    pub task_id: String,
    /// The fencing token of this attempt: 1 on the first attempt.
    pub attempt_number: u32,
    /// The plugin's position in the scan's profile, from 0.
    pub position: u32,
}

impl TaskInput {
    /// An input with only a target: for plugin tests.
    pub fn for_target(plugin: &str, target: &str) -> Self {
        Self {
            plugin: plugin.to_owned(),
            target: target.to_owned(),
            attempt_number: 1,
            ..Self::default()
        }
    }
}

/// Why a plugin could not finish. Sent to ingestion as the attempt's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct PluginError {
    /// A short snake_case code, e.g. `"target_unreachable"`.
    pub code: String,
    /// For people; may include details of the target.
    pub message: String,
    /// False when running the task again cannot help (bad target, unsupported input).
    pub retryable: bool,
}

impl PluginError {
    /// A failure that a later attempt may not hit (timeouts, refused connections).
    pub fn retryable(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure every attempt would hit (bad target, unsupported input).
    pub fn permanent(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            retryable: false,
        }
    }
}

/// One result a plugin produced.
#[derive(Debug, Clone, PartialEq)]
pub enum ResultItem {
    Finding(v1::Finding),
    Asset(v1::Asset),
    /// What a rule concluded on a resource, found or not (`v1::Evaluation::pass` and its
    /// siblings build one).
    Evaluation(v1::Evaluation),
}

/// The sink no longer takes results: the task is stopping. A plugin that gets this returns
/// (its result is ignored); `?` turns it into a [`PluginError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the task is stopping and takes no more results")]
pub struct SinkClosed;

impl From<SinkClosed> for PluginError {
    fn from(_: SinkClosed) -> Self {
        PluginError::retryable("cancelled", "the task stopped before the plugin finished")
    }
}

/// Where a plugin puts its results. Sending waits while the worker has too many unacknowledged
/// batches, so a fast plugin cannot outrun ingestion. Files go through [`ResultSink::artifact`].
/// Cheap to clone.
#[derive(Clone)]
pub struct ResultSink {
    sender: mpsc::Sender<ResultItem>,
    artifacts: Option<Arc<dyn ArtifactUploader>>,
}

impl std::fmt::Debug for ResultSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultSink")
            .field("artifacts", &self.artifacts.is_some())
            .finish_non_exhaustive()
    }
}

impl ResultSink {
    /// A sink and the receiving end of its bounded queue. The worker uses it for each lease;
    /// plugin tests use it to collect what a plugin emits.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<ResultItem>) {
        assert!(capacity > 0, "a sink needs room for at least one result");
        let (sender, receiver) = mpsc::channel(capacity);
        (
            Self {
                sender,
                artifacts: None,
            },
            receiver,
        )
    }

    /// This sink, uploading artifacts through `uploader` (the worker gives each lease its own;
    /// a plugin test may give one that keeps the files).
    pub fn with_artifacts(mut self, uploader: Arc<dyn ArtifactUploader>) -> Self {
        self.artifacts = Some(uploader);
        self
    }

    /// Uploads `bytes` as an artifact of this task, named `name` (a file name) with the media
    /// type `content_type`, and returns it once ingestion verified and kept it. Fails with
    /// `artifacts_unavailable` on a sink without an uploader.
    pub async fn artifact(
        &self,
        name: &str,
        content_type: &str,
        bytes: Bytes,
    ) -> Result<UploadedArtifact, PluginError> {
        let Some(uploader) = &self.artifacts else {
            return Err(PluginError::permanent(
                "artifacts_unavailable",
                "this result sink uploads no artifacts",
            ));
        };
        uploader.upload(name, content_type, bytes).await
    }

    pub async fn finding(&self, finding: v1::Finding) -> Result<(), SinkClosed> {
        self.send(ResultItem::Finding(finding)).await
    }

    pub async fn asset(&self, asset: v1::Asset) -> Result<(), SinkClosed> {
        self.send(ResultItem::Asset(asset)).await
    }

    /// Reports that a rule was checked on a resource, and what it concluded: a scan's coverage
    /// is made of these. Report one for every check the plugin makes, a pass as much as a
    /// failure (a failure after its finding).
    pub async fn evaluation(&self, evaluation: v1::Evaluation) -> Result<(), SinkClosed> {
        self.send(ResultItem::Evaluation(evaluation)).await
    }

    async fn send(&self, item: ResultItem) -> Result<(), SinkClosed> {
        self.sender.send(item).await.map_err(|_| SinkClosed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_sink_refuses_results() {
        let (sink, mut receiver) = ResultSink::channel(1);
        sink.asset(v1::Asset::default()).await.unwrap();
        assert!(matches!(receiver.recv().await, Some(ResultItem::Asset(_))));
        drop(receiver);
        assert_eq!(sink.finding(v1::Finding::default()).await, Err(SinkClosed));
        let error: PluginError = SinkClosed.into();
        assert_eq!(error.code, "cancelled");
    }
}
