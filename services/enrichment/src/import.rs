//! Offline import of NVD JSON 2.0 files into the local CVE table (`palisade cve import`), for
//! sites without internet: NVD's data feeds (`nvdcve-2.0-2024.json`, `.json.gz` too) or saved
//! API pages, which share one format. A file's records are written in chunks; a record older
//! than the one the table holds never replaces it, and importing a file again writes nothing.
//! A record that cannot be kept as the file holds it is stored sanitised or set aside and
//! recorded in `cve_quarantine`, as the sync does (`crate::cve::quarantine`): it costs the
//! import that record only.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use store::PgPool;
use store::cves::{CveOrigin, Written};

use crate::nvd::format::{self, FormatError};

/// Records written per statement.
const CHUNK: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}; give NVD JSON 2.0 files (data feeds or API pages)", path.display())]
    Format {
        path: PathBuf,
        #[source]
        source: FormatError,
    },
    #[error("{} holds no .json or .json.gz file", path.display())]
    NoFiles { path: PathBuf },
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// What importing one file did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileImported {
    pub path: PathBuf,
    /// CVE records the file held.
    pub records: u64,
    /// Rows written (the rest were as new in the table already).
    pub written: u64,
    /// Records stored sanitised or set aside.
    pub quarantined: u64,
}

/// The files `path` names: itself, or the `.json` and `.json.gz` files in it (not its
/// subfolders), sorted by name.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, ImportError> {
    let read = |source| ImportError::Read {
        path: path.to_owned(),
        source,
    };
    if !path.metadata().map_err(read)?.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(read)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|file| {
            let name = file
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("");
            file.is_file() && (name.ends_with(".json") || name.ends_with(".json.gz"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ImportError::NoFiles {
            path: path.to_owned(),
        });
    }
    Ok(files)
}

/// Imports one file.
pub async fn import_file(pool: &PgPool, path: &Path) -> Result<FileImported, ImportError> {
    let owned = path.to_owned();
    let page = tokio::task::spawn_blocking(move || read_page(&owned))
        .await
        .map_err(|error| ImportError::Read {
            path: path.to_owned(),
            source: std::io::Error::other(error),
        })??;
    let mut written = 0;
    for chunk in page.records.chunks(CHUNK) {
        if let Written::Rows(rows) =
            store::cves::upsert(pool, None, CveOrigin::Import, chunk).await?
        {
            written += rows;
        }
    }
    let quarantined = crate::cve::quarantine(pool, CveOrigin::Import, &page.quarantined).await?;
    Ok(FileImported {
        path: path.to_owned(),
        records: page.records.len() as u64,
        written,
        quarantined,
    })
}

fn read_page(path: &Path) -> Result<format::Page, ImportError> {
    let read = |source| ImportError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut body = Vec::new();
    if path.extension().is_some_and(|extension| extension == "gz") {
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut body)
            .map_err(read)?;
    } else {
        std::io::BufReader::new(file)
            .read_to_end(&mut body)
            .map_err(read)?;
    }
    let mut page = format::parse(&body).map_err(|source| ImportError::Format {
        path: path.to_owned(),
        source,
    })?;
    page.locate(&path.display().to_string());
    Ok(page)
}
