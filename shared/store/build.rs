//! Two things this crate embeds at compile time:
//! - `sqlx::migrate!` embeds `migrations/`: rebuild when a migration is added or changed, not
//!   only when this crate's code changes;
//! - every statement palisade runs is a file `sql/<table>/<name>.sql`. This script turns the
//!   folder into the module tree `sql::<table>::<NAME>` (the file's leading `--` comment becomes
//!   the constant's documentation), a binder `sql::<table>::<Name>` per statement with
//!   parameters (one field per `$n` line, bounded by the PostgreSQL type it declares; see
//!   `build/header.rs`), and the list `sql::STATEMENTS` that `tests/tests/system/schema.rs`
//!   prepares against the migrated schema, comparing the declared types with PostgreSQL's.

#[path = "build/header.rs"]
mod header;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
    println!("cargo:rerun-if-changed=sql");
    println!("cargo:rerun-if-changed=build/header.rs");
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
        writeln!(
            modules,
            "    #[allow(unused_imports)] // for the binders' bounds\n    use super::pg;"
        )
        .unwrap();
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
            let parameters = header::parameters(&doc)
                .map_err(|problem| format!("{}: {problem}", file.display()))?;
            let constant = stem.to_uppercase();
            for line in &doc {
                writeln!(modules, "    #[doc = {line:?}]").unwrap();
            }
            writeln!(
                modules,
                "    pub(crate) const {constant}: &str = include_str!({path:?});"
            )
            .unwrap();
            binder(&mut modules, &constant, &camel_case(&stem), &parameters);
            let declared: Vec<&str> = parameters.iter().map(|p| p.pg_type.as_str()).collect();
            writeln!(
                list,
                "    Statement {{ name: \"{table_name}/{stem}\", text: include_str!({path:?}), \
                 parameters: &{declared:?} }},"
            )
            .unwrap();
        }
        modules.push_str("}\n\n");
    }
    list.push_str("];\n");
    Ok(modules + &list)
}

/// The struct binding a statement's parameters by name, and its `query*` methods binding the
/// fields in `$n` order through `sql::query*`.
fn binder(out: &mut String, constant: &str, name: &str, parameters: &[header::Parameter]) {
    if parameters.is_empty() {
        return;
    }
    let generics: Vec<String> = (1..=parameters.len()).map(|n| format!("T{n}")).collect();
    let generics = generics.join(", ");
    writeln!(
        out,
        "    /// The parameters of [`{constant}`] by name; each field takes a value of the \
         PostgreSQL type its `$n` line declares.\n    pub(crate) struct {name}<{generics}> {{"
    )
    .unwrap();
    for (index, parameter) in parameters.iter().enumerate() {
        let description = match parameter.description.as_str() {
            "" => String::new(),
            description => format!(" — {description}"),
        };
        writeln!(
            out,
            "        #[doc = {:?}]\n        pub(crate) {}: T{},",
            format!("`${}`: `{}`{description}", index + 1, parameter.pg_type),
            parameter.name,
            index + 1
        )
        .unwrap();
    }
    out.push_str("    }\n");
    let bounds: Vec<String> = parameters
        .iter()
        .enumerate()
        .map(|(index, parameter)| {
            let marker = header::marker(&parameter.pg_type).expect("checked by header::parameters");
            format!(
                "T{}: super::Binds<{marker}> + super::Encode<'q, super::Postgres> \
                 + super::Type<super::Postgres> + 'q",
                index + 1
            )
        })
        .collect();
    let binds: String = parameters
        .iter()
        .map(|parameter| format!(".bind(self.{})", parameter.name))
        .collect();
    writeln!(
        out,
        "    #[allow(dead_code)] // a statement runs through one or two of the three
    impl<'q, {generics}> {name}<{generics}>
    where
        {bounds},
    {{
        /// [`super::query`] with the fields bound in `$n` order.
        pub(crate) fn query(self) -> super::Query<'q, super::Postgres, super::PgArguments> {{
            super::query({constant}){binds}
        }}
        /// [`super::query_as`] with the fields bound in `$n` order.
        pub(crate) fn query_as<O>(self) -> super::QueryAs<'q, super::Postgres, O, super::PgArguments>
        where
            O: for<'r> super::FromRow<'r, super::PgRow>,
        {{
            super::query_as({constant}){binds}
        }}
        /// [`super::query_scalar`] with the fields bound in `$n` order.
        pub(crate) fn query_scalar<O>(self) -> super::QueryScalar<'q, super::Postgres, O, super::PgArguments>
        where
            (O,): for<'r> super::FromRow<'r, super::PgRow>,
        {{
            super::query_scalar({constant}){binds}
        }}
    }}",
        bounds = bounds.join(",\n        ")
    )
    .unwrap();
}

/// `grant_next` → `GrantNext`.
fn camel_case(stem: &str) -> String {
    stem.split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
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
