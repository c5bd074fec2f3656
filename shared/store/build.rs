//! Two things this crate embeds at compile time:
//! - `sqlx::migrate!` embeds `migrations/`: rebuild when a migration is added or changed, not
//!   only when this crate's code changes;
//! - every statement palisade runs is a file `sql/<table>/<name>.sql`. This script turns the
//!   folder into the module tree `sql::<table>::<NAME>` (the file's leading `--` comment becomes
//!   the constant's documentation) and the list `sql::STATEMENTS` that
//!   `tests/tests/system/schema.rs` prepares against the migrated schema.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
    println!("cargo:rerun-if-changed=sql");
    let root = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("sql");
    let out = Path::new(&env::var("OUT_DIR").unwrap()).join("sql.rs");
    let code = generate(&root).unwrap_or_else(|problem| panic!("{problem}"));
    fs::write(&out, code).unwrap();
}

fn generate(root: &Path) -> Result<String, String> {
    let mut modules = String::new();
    let mut list = String::from(
        "/// Every statement under `sql/`, for the test that prepares each against the schema.\n\
         pub static STATEMENTS: &[Statement] = &[\n",
    );
    for table in sorted_entries(root)? {
        let table_name = file_name(&table)?;
        check_identifier(&table, &table_name)?;
        if !table.is_dir() {
            return Err(format!(
                "{}: sql/ holds one folder per table, not files",
                table.display()
            ));
        }
        writeln!(modules, "pub(crate) mod {table_name} {{").unwrap();
        for file in sorted_entries(&table)? {
            let Some(stem) = file_name(&file)?.strip_suffix(".sql").map(str::to_owned) else {
                return Err(format!("{}: only .sql files belong here", file.display()));
            };
            check_identifier(&file, &stem)?;
            let text = fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let doc = leading_comment(&text);
            if doc.is_empty() {
                return Err(format!(
                    "{}: begin the statement with `--` lines saying what it decides and what \
                     its parameters are",
                    file.display()
                ));
            }
            let path = file.display().to_string();
            for line in doc {
                writeln!(modules, "    #[doc = {line:?}]").unwrap();
            }
            writeln!(
                modules,
                "    pub(crate) const {}: &str = include_str!({path:?});",
                stem.to_uppercase()
            )
            .unwrap();
            writeln!(
                list,
                "    Statement {{ name: \"{table_name}/{stem}\", text: include_str!({path:?}) }},"
            )
            .unwrap();
        }
        modules.push_str("}\n\n");
    }
    list.push_str("];\n");
    Ok(modules + &list)
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut entries = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    entries.sort();
    Ok(entries)
}

fn file_name(path: &Path) -> Result<String, String> {
    path.file_name()
        .and_then(|name| name.to_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("{}: not a UTF-8 name", path.display()))
}

fn check_identifier(path: &Path, name: &str) -> Result<(), String> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{}: name it in snake_case (it becomes a Rust identifier)",
            path.display()
        ))
    }
}

/// The statement's leading `--` lines, without the dashes.
fn leading_comment(text: &str) -> Vec<String> {
    text.lines()
        .map_while(|line| line.trim_start().strip_prefix("--"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line).to_owned())
        .collect()
}
